"""What a framework adapter needs from Zephon, in one public module.

An adapter translates between its framework and four things here:

- :class:`RunGeometry`: this process's data-parallel rank and size, as the framework gives
  them or (pure data parallelism) from ``torch.distributed`` or the launcher's environment.
- :func:`choose_lanes`: the lane count of a run and why. The recipe's ``lanes``, else the
  adapter's option, else the lanes of the checkpoint the run resumes from, else
  :data:`~zephon.loader_options.DEFAULT_LANES_PER_READER` per data-parallel rank of the first
  launch.
  Every data-parallel size dividing the lanes reads the same global batches, so a run started
  on 12 readers (96 lanes) resumes exactly on 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48 or 96.
- :func:`merge_states`: the lane-keyed states of several ranks as one state, which a run at
  any data-parallel size dividing the lanes loads (each rank takes its own lanes).
- :class:`FrameworkValues` and :func:`check_recipe`: the values the framework owns (sequence
  length, microbatch rows, data-parallel size, lanes, vocabulary), which fill a recipe's holes
  (:meth:`DataRecipe.resolve <zephon.recipe.DataRecipe.resolve>`), and the preflight: every
  problem of a recipe in this run, listed before the model is built.
- :class:`LoaderSession`: one rank's pipeline as the training loop consumes it: microbatches
  as ``SampleBatch.to_training`` tensors, the lane-keyed state of what was consumed, and the
  job-wide ``zephon/`` metrics of :mod:`zephon.meter`.

Nothing here reads process globals or changes the environment; adapters pass what their
framework knows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from zephon.artifacts import as_text, from_text
from zephon.errors import ConfigError, StateMismatchError
from zephon.loader_options import DEFAULT_LANES_PER_READER, lanes_problem
from zephon.meter import LoaderMeter
from zephon.pipeline import Pipeline
from zephon.recipe import FrameworkValues, ResolvedRecipe
from zephon.recipe.checks import check_recipe
from zephon.sample_batch import SampleBatch

__all__ = ["FrameworkValues", "LaneChoice", "LoaderSession", "ResolvedRecipe", "RunGeometry",
           "check_recipe", "choose_lanes", "lanes_problem", "merge_states"]

@dataclass(frozen=True)
class RunGeometry:
    """Where this process reads in the data-parallel job."""

    dp_rank: int = 0
    """This reader's data-parallel rank, ``0 <= dp_rank < dp_size``."""
    dp_size: int = 1
    """Data-parallel readers of the job."""

    def __post_init__(self) -> None:
        if not (isinstance(self.dp_size, int) and self.dp_size >= 1
                and isinstance(self.dp_rank, int) and 0 <= self.dp_rank < self.dp_size):
            raise ConfigError(f"data-parallel rank {self.dp_rank!r} of size {self.dp_size!r}: "
                              "the size must be >= 1 and the rank in 0..size-1")

    @classmethod
    def from_environment(cls) -> RunGeometry:
        """Pure data parallelism: every process is a reader. The rank and size of the default
        ``torch.distributed`` group when it is initialized, else the launcher's ``RANK`` and
        ``WORLD_SIZE`` (torchrun, accelerate), else one reader."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size())
        except ImportError:
            pass
        try:
            return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
        except ValueError:
            raise ConfigError(f"RANK={os.environ.get('RANK')!r}, WORLD_SIZE="
                              f"{os.environ.get('WORLD_SIZE')!r}: not integers") from None


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


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The lane-keyed states of several ranks (``{"lane_<l>": entry}`` each) as one. A lane
    found twice must hold the same entry: two different ones come from different runs or
    steps, an error naming the lane."""
    merged: dict[str, Any] = {}
    for state in states:
        for key, entry in state.items():
            if key in merged and merged[key] != entry:
                raise StateMismatchError(f"two loader states hold different entries for "
                                         f"{key!r}: they were written by different runs or at "
                                         "different steps")
            merged[key] = entry
    return merged


def state_as_text(state: Mapping[str, Any]) -> dict[str, str]:
    """``{"lane_<l>": entry}`` with each entry as JSON text, for checkpointers that store
    opaque values per key (TorchTitan's DCP): plain data, never a pickle."""
    return {key: as_text(entry) for key, entry in state.items()}


def state_from_text(state: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The inverse of :func:`state_as_text` (entries already decoded pass as they are);
    pickled entries are refused by name, never loaded."""
    return {key: from_text(entry, f"{where}: {key}") for key, entry in state.items()}


class LoaderSession:
    """One rank's pipeline as the training loop consumes it.

    Iterating yields one microbatch at a time as ``batch.to_training(**training)``, and
    records what was handed out (tokens, padding, labels that count, the seconds the loop
    waited) for :meth:`metrics`. :meth:`state_dict` describes the microbatches handed out so
    far, never those the prefetch thread prepared, so a resume from it continues with the next
    one, token for token. Iterating again after the end of the data starts the data over
    (:meth:`Pipeline.reset`)."""

    def __init__(self, pipeline: Pipeline, training: Mapping[str, Any] | None = None, *,
                 metrics_group: Any = None, replicas: int = 1) -> None:
        """``replicas``: ranks that read each data-parallel rank's lanes within
        ``metrics_group`` (tensor-parallel peers reading alike), whose figures count once."""
        self.pipeline = pipeline
        self.training = dict(training or {})
        """``SampleBatch.to_training`` options."""
        self.meter = LoaderMeter(metrics_group, replicas)
        """Totals of this rank; :meth:`metrics` sums them over ``metrics_group``."""
        self._ended = [False]
        """Whether the last iterator reached the end of the data (a list its generator sets:
        see :meth:`batches`)."""
        self._active: Iterator[tuple[SampleBatch, dict[str, Any]]] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (out for _, out in self.batches())

    def batches(self) -> Iterator[tuple[SampleBatch, dict[str, Any]]]:
        """Each microbatch and its training tensors, for adapters that also need the
        records (traces); iterating the session gives the tensors alone. A new call closes
        the previous iterator (one consumer at a time)."""
        self.close()
        if self._ended[0]:
            self.pipeline.reset()
        self._ended[0] = False
        # The generator holds what it uses, not the session: a session the caller drops
        # then drops its iterator at once (no reference cycle to wait for the collector),
        # and the iterator stops its prefetch thread.
        self._active = _hand_out(self.pipeline, self.training, self.meter, self._ended)
        return self._active

    def close(self) -> None:
        """Stop the prefetch of the current iterator; the consumed state stays as it is."""
        active, self._active = self._active, None
        if active is not None:
            active.close()

    def restart(self) -> None:
        """Start over from the beginning of the data at the next :meth:`batches`."""
        self.close()
        self._ended[0] = True

    def metrics(self) -> dict[str, float]:
        """``zephon/...`` figures of the window since the last call; a collective over
        ``metrics_group`` when one was given (call it on every rank at the same step)."""
        return self.meter.window(self.pipeline.report())

    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": entry}`` for this rank's lanes: plain data (JSON-safe)."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state holding (at least) this rank's lanes, written at any
        data-parallel size dividing the lanes (see :func:`merge_states`)."""
        self.close()
        self.pipeline.load_state_dict(dict(state))
        self._ended[0] = False


def _hand_out(pipeline: Pipeline, training: Mapping[str, Any], meter: LoaderMeter,
              ended: list[bool]) -> Iterator[tuple[SampleBatch, dict[str, Any]]]:
    """The session's microbatches with their training tensors, each counted in ``meter``;
    ``ended[0]`` is set at the end of the data."""
    start = time.perf_counter()
    for batch in pipeline:
        out = batch.to_training(**training)
        _record(meter, training, batch, out, time.perf_counter() - start)
        yield batch, out
        start = time.perf_counter()
    ended[0] = True


def _record(meter: LoaderMeter, training: Mapping[str, Any], batch: SampleBatch,
            out: Mapping[str, Any], wait_s: float) -> None:
    """Count a microbatch handed out, finding each tensor under the name the training
    options give it (``rename_fields``), or from the records where it was left out."""
    renamed = training.get("rename_fields") or {}

    def tensor(name: str) -> Any:
        return out.get(renamed.get(name, name))

    ids = tensor("input_ids")
    if ids is not None:
        tokens = int(ids.numel())
    else:  # excluded: the rows' tokens, less the last of each where labels shift them
        shift = 1 if training.get("return_labels") else 0
        tokens = sum(len(r.payload["input_ids"]) - shift for r in batch.records)
    padding_mask, valid_count, loss_mask = (tensor(n) for n in (
        "padding_mask", "num_valid_tokens", "loss_mask"))
    if padding_mask is not None:
        padding = int(padding_mask.sum())
    else:
        padding = sum(int(r.meta.get("padding", 0)) for r in batch.records)
    if valid_count is not None:
        valid = int(valid_count.sum())
    elif loss_mask is not None:
        valid = int(loss_mask.sum())
    else:
        valid = tokens - padding
    meter.record(tokens, padding, valid, wait_s)
