"""The run record: what a run's folder says about the data it trained on.

An adapter writes ``zephon-run.json`` into the run's folder when training starts (global rank
0, before the first step): the framework, the training recipe's path, the seed and lanes the
run chose, and its geometry (data-parallel readers, rows per microbatch, tokens per row,
microbatches per step), with where its checkpoints are. Tools then take the run instead of a
list of numbers typed again: ``zephon trace RUN_DIR --steps N`` reads the recipe and the
geometry from the record and starts from the newest checkpoint before step ``N``.

A resumed run (the same folder) writes the record again: a resume at another data-parallel
size changes the readers, never what a step holds. The record is a sealed artifact
(:mod:`zephon.artifacts`), read back as plain data and checked field by field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.artifacts import read, write
from zephon.field_checks import StateFieldError, need_int, need_list, need_str

RUN_RECORD = "zephon-run.json"
KIND = "run_record"
VERSION = 1


@dataclass(frozen=True)
class RunRecord:
    """What a run's folder says about its data (see the module docstring)."""

    framework: str
    """``"torchtitan"``, ``"megatron"`` or ``"torch"``: the preset its recipe is read with."""
    recipe: str | None
    """The training recipe's absolute path; None where the framework's own data flags made
    the recipe (Megatron's ``--data-path``: ``flags`` then tell it)."""
    lanes: int
    dp_size: int
    """Data-parallel readers when the record was written."""
    microbatch_size: int
    """Rows per microbatch."""
    seq_len: int
    """Input tokens per row (rows are packed to ``seq_len + 1``)."""
    microbatches_per_step: int
    """Microbatches of the job per optimizer step (the global batch over the rows per
    microbatch)."""
    seed: int | None = None
    """The seed the run chose over the recipe's (None: the recipe's)."""
    checkpoints: str | None = None
    """Where the run's checkpoints are, relative to the run's folder (None: none kept)."""
    start_step: int = 0
    """The step at which the data started (a run that restarted its data from a checkpoint
    while keeping the model)."""
    flags: tuple[str, ...] = ()
    """The framework's own command line where it defines the data (Megatron's flags)."""

    def write(self, folder: str | os.PathLike[str]) -> Path:
        """Write the record into ``folder`` (created), atomically."""
        path = Path(folder) / RUN_RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = dataclasses.asdict(self)
        write(path, KIND, {"version": VERSION, **fields, "flags": list(self.flags)})
        return path

    @classmethod
    def read(cls, folder: str | os.PathLike[str]) -> RunRecord:
        """The record of the run in ``folder``; an ArtifactError names the field refused."""
        return read(Path(folder) / RUN_RECORD, KIND, _checked)


def find_record(folder: str | os.PathLike[str]) -> Path | None:
    """The record file of ``folder``, or None where it holds none."""
    path = Path(folder) / RUN_RECORD
    return path if path.is_file() else None


def _optional(value: Any, path: str, check: Any) -> Any:
    return None if value is None else check(value, path)


def _checked(fields: dict[str, Any]) -> RunRecord:
    need_int(fields.get("version"), "version", VERSION, VERSION)
    framework = need_str(fields.get("framework"), "framework")
    if framework not in ("torchtitan", "megatron", "torch"):
        raise StateFieldError("framework", f"is {framework!r}, not torchtitan, megatron or "
                                           "torch")
    flags = need_list(fields.get("flags"), "flags")
    for i, flag in enumerate(flags):
        need_str(flag, f"flags[{i}]")
    return RunRecord(
        framework=framework,
        recipe=_optional(fields.get("recipe"), "recipe", need_str),
        lanes=need_int(fields.get("lanes"), "lanes", 1),
        dp_size=need_int(fields.get("dp_size"), "dp_size", 1),
        microbatch_size=need_int(fields.get("microbatch_size"), "microbatch_size", 1),
        seq_len=need_int(fields.get("seq_len"), "seq_len", 1),
        microbatches_per_step=need_int(fields.get("microbatches_per_step"),
                                       "microbatches_per_step", 1),
        seed=_optional(fields.get("seed"), "seed", need_int),
        checkpoints=_optional(fields.get("checkpoints"), "checkpoints", need_str),
        start_step=need_int(fields.get("start_step"), "start_step"),
        flags=tuple(flags))
