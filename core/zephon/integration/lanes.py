"""The lane count of a run, and why.

The recipe's ``lanes``, else the adapter's option, else the lanes of the checkpoint the run
resumes from, else :data:`~zephon.loader_options.DEFAULT_LANES_PER_READER` per data-parallel
rank of the first launch. Every data-parallel size dividing the lanes reads the same global
batches, so a run started on 12 readers (96 lanes) resumes exactly on 1, 2, 3, 4, 6, 8, 12,
16, 24, 32, 48 or 96.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError
from zephon.loader_options import DEFAULT_LANES_PER_READER, lanes_problem

__all__ = ["LaneChoice", "choose_lanes", "lanes_problem", "saved_lanes"]


@dataclass(frozen=True)
class LaneChoice:
    """The lanes of a run and where the number came from, for the start-up log line."""

    lanes: int
    why: str


def choose_lanes(dp_size: int, *, recipe: int | None = None, option: int | None = None,
                 option_name: str = "the lanes option", saved: int | None = None,
                 source: str = "the recipe") -> LaneChoice:
    """The lanes of a run (see the module docstring for the order). ``recipe`` and
    ``option`` must agree where both are given; ``saved`` is the lane count of the checkpoint
    being resumed (None: a first launch). :func:`lanes_problem` says whether ``dp_size``
    readers can share them; adapters report it with their other launch problems."""
    if recipe is not None and option is not None and recipe != option:
        raise ConfigError(f"{source}: lanes = {recipe} conflicts with {option_name} {option}; "
                          "remove one or make them agree")
    if recipe is not None:
        choice = LaneChoice(recipe, f"lanes = {recipe} in {source}")
    elif option is not None:
        choice = LaneChoice(option, f"{option_name} {option}")
    elif saved is not None:
        choice = LaneChoice(saved, "those of the checkpoint the run resumes from")
    else:
        lanes = DEFAULT_LANES_PER_READER * dp_size
        choice = LaneChoice(lanes, f"{DEFAULT_LANES_PER_READER} per data-parallel reader: "
                                   f"resumable at any data-parallel size dividing {lanes}")
    return choice


def saved_lanes(state: Mapping[str, Any] | None) -> int | None:
    """The lane count a lane-keyed state (``{"lane_<l>": entry}``) was written with, from
    its entries' fingerprint, or None (no state, or one whose entries cannot tell: loading it
    names what is wrong with them)."""
    if not state:
        return None
    entry = next(iter(state.values()))
    try:
        return int(entry["fingerprint"]["lanes"])
    except (TypeError, KeyError, ValueError):
        return None
