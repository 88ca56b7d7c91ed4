"""The per-rank trace file: one JSON line per microbatch a trainer received.

``<trace_dir>/rank<r>.jsonl``, ``r`` the global rank, appended (a resumed run adds to its
file): the global microbatch index, lane, record ids and the SHA-256 of each tensor the
trainer received (:func:`zephon.trace.trace_line`), plus what the adapter adds. ``zephon
trace`` lists what a step read; these lines say what the trainer got, for audits and resume
tests. A line is flushed as it is written, so a run killed mid-step leaves whole lines.
"""

from __future__ import annotations

import json
import os
from typing import Any

from zephon.integration.geometry import global_rank
from zephon.trace import trace_line


class TraceFile:
    """This rank's trace file (see the module docstring)."""

    def __init__(self, trace_dir: str | os.PathLike[str]):
        os.makedirs(trace_dir, exist_ok=True)
        self.path = os.path.join(trace_dir, f"rank{global_rank()}.jsonl")
        self._file = open(self.path, "a")  # noqa: SIM115 (open for the run)

    @classmethod
    def open(cls, trace_dir: str | os.PathLike[str] | None) -> TraceFile | None:
        """The trace file of ``trace_dir``, or None where none is asked for."""
        return cls(trace_dir) if trace_dir else None

    def write(self, batch: Any, lanes: int, dp_rank: int, dp_size: int,
              tensors: dict[str, Any], **extra: Any) -> None:
        """One line: ``batch`` (a :class:`~zephon.SampleBatch`) as the trainer received it in
        ``tensors``; ``extra`` adds fields (shapes, counts)."""
        line = trace_line(batch, lanes, dp_rank, dp_size, tensors, **extra)
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
