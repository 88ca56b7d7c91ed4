"""Loader state: per-lane entries with a fingerprint, and how mismatches are explained.

``Pipeline.state_dict()`` returns ``{"lane_<l>": entry}`` for the lanes a rank owns. An entry
holds the lane's snapshot after its last *consumed* microbatch (every node's snapshot, in chain
order), the number of global microbatches the run had consumed when the state was taken, and
the fingerprint of everything that must not change across a resume. Keys are lane-unique, so
checkpoints written by any number of ranks can be merged and loaded at any data-parallel size
that divides the lane count. Entries are plain data (dicts, lists, numbers, strings and numpy
arrays), so a checkpoint does not depend on the names or layout of Zephon's classes;
``STATE_VERSION`` changes when their meaning does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from zephon.errors import StateMismatchError

STATE_VERSION = 2


def lane_key(lane: int) -> str:
    return f"lane_{lane}"


_WHAT = {
    "lanes": "the lane count",
    "work_source.datasets": "the datasets or their files (another revision?)",
    "work_source.mixture": "the mixture weights",
    "work_source.seed": "the seed",
    "work_source": "the work source options",
    "ops": "the operators",
}


def first_difference(saved: Any, current: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first path at which two fingerprints differ, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in current:
                return sub, saved.get(key), current.get(key)
            found = first_difference(saved[key], current[key], sub)
            if found:
                return found
        return None
    if (isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple))
            and len(saved) == len(current)):
        for i, (a, b) in enumerate(zip(saved, current, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if saved == current else (path, saved, current)


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], key: str,
                      titles: Sequence[str] = ()) -> None:
    """Refuse ``saved`` unless it equals ``current``, naming what changed; ``titles`` names the
    options of each operator in ``current["ops"]`` (e.g. ``"packing"``)."""
    found = first_difference(saved, current)
    if found is None:
        return
    path, old, new = found
    op = re.match(r"ops\[(\d+)\]", path)
    if op and int(op.group(1)) < len(titles):
        what = f"the {titles[int(op.group(1))]} options"
    else:
        what = next((text for prefix, text in _WHAT.items() if path.startswith(prefix)), path)
    raise StateMismatchError(
        f"loader state {key!r} was written by a different pipeline: {what} changed "
        f"({path}: checkpoint {_short(old)}, now {_short(new)}). Resume with the same recipe, "
        "or start a new run.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
