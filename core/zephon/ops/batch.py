"""``batch``: group records into SampleBatch objects of ``microbatch_size``.

At a flush (the end of a lane's data) a short batch is emitted only with ``drop_last=False``;
otherwise its records are dropped and counted (documents and tokens) in the pipeline report.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon.errors import ConfigError


@dataclass(frozen=True)
class BatchSpec:
    microbatch_size: int
    """Records per SampleBatch."""
    drop_last: bool = True
    """Drop (and count) a short batch at a flush instead of emitting it."""

    def __post_init__(self) -> None:
        if not isinstance(self.microbatch_size, int) or self.microbatch_size <= 0:
            raise ConfigError(f"batch: microbatch_size must be a positive integer, "
                              f"got {self.microbatch_size!r}")
