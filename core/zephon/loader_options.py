"""``LoaderOptions``: how a pipeline runs on this process, as opposed to what it reads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zephon.distributed import STARTUP_TIMEOUT_S
from zephon.errors import ConfigError
from zephon.io.store_options import StoreOptions

DEFAULT_LANES_PER_READER = 8
"""Lanes per data-parallel rank that the framework adapters choose when nothing fixes the
lanes: 8 packers and shuffle buffers per rank (a constant memory per rank), and a run that can
later resume 8x larger or at any divisor of its lanes."""


_BOUNDS = {"lanes": (1, 1 << 20), "dp_world_size": (1, 1 << 24), "prefetch": (0, 1 << 10),
           "dp_rank": (0, 1 << 24), "workers": (0, 1 << 10), "read_ahead_tokens": (1, 1 << 48),
           "start_step": (0, 1 << 62)}
"""Least and most of each integer option. The upper bounds are far above any real run (a
million lanes, 1,024 worker processes) and stop a typo from allocating per-lane state or
spawning processes without end."""


@dataclass(frozen=True)
class LoaderOptions:
    """Lanes, this process's place among the data-parallel ranks, read-ahead and storage."""

    lanes: int | None = None
    """Lanes of the run: fixed for the run, while the data-parallel size may change to any
    divisor of it. None: equal to ``dp_world_size`` (with a warning, since changing the number
    of ranks then changes the data)."""
    dp_rank: int = dataclasses.field(default=0, metadata={"recipe": False})
    """This process's data-parallel rank (given by the framework)."""
    dp_world_size: int = dataclasses.field(default=1, metadata={"recipe": False})
    """Number of data-parallel ranks (given by the framework)."""
    prefetch: int = 4
    """0: the lanes run in the caller's thread, a round at a time. Positive: a background
    thread runs them ahead, within ``read_ahead_tokens``, and (with ``workers=0``) one or two
    more run the document operators a batch ahead of it, so the tokenizer encodes while the
    lanes pack: two when this rank has two cores to itself (its cores divided among
    ``LOCAL_WORLD_SIZE`` ranks). Never changes the data. The thread pays whenever the
    trainer waits for its device: its steps then took no longer than without a loader, against
    3-10 points longer with 0; only a single process that does nothing but read is faster
    with 0, by 7-36% (measured: docs/measurements.md)."""
    read_ahead_tokens: int = 1 << 24
    """Tokens the background thread may hold ahead of the consumer (with ``prefetch > 0``), in
    whole rounds (a round is one microbatch of every lane this rank owns), at most 64 rounds.
    The default, 16.8M tokens, is about 130 MiB of token ids and positions, and allows the
    64 rounds while a round is at most 262k tokens (for example 8 lanes of 4 x 8192). Smaller
    budgets hold fewer rounds (at least one); each agreement on the end of data then grants
    fewer rounds, so ranks agree more often. Rounds of unpacked rows have no fixed size and
    always hold 64."""
    workers: int = 0
    """Processes running the document operators (reading, decoding, tokenizing) beside the
    lanes: 0 keeps them in this process (on the document threads, or with ``prefetch=0`` in the
    lanes' thread). The data, the state and every resume are the
    same for every value. Each worker loads the operators (the tokenizer) once, a start-up
    cost and its own copy in memory; worth it where tokenization or Python per-document work
    is the bottleneck and cores are free (see ``benchmarks/throughput.py``; measured:
    docs/measurements.md)."""
    start_step: int = dataclasses.field(default=0, metadata={"recipe": False})
    """Training steps the trainer had taken when this pipeline's data began (given by the
    framework): 0, unless the run restarted its data mid-training (TorchTitan's
    ``--checkpoint.exclude_from_loading dataloader``). Kept in the loader state, so that
    ``zephon trace`` maps a step to the microbatches that trained it. Never changes the
    data."""
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    """How long a rank waits at start-up for a peer that neither arrives nor fails (one
    listing the files for all ranks, or building its pipeline before the rank check); past it
    the error names the ranks that did not arrive. A peer whose start-up fails is named at
    once, whatever this says."""
    process_group: Any = dataclasses.field(default=None, metadata={"recipe": False})
    """The data-parallel group used to agree on the end of data (None: the whole world, over
    a gloo group)."""
    io_options: StoreOptions = dataclasses.field(default_factory=StoreOptions,
                                                 metadata={"recipe": False})
    """Storage options: the shard cache for Hub data (a recipe's ``[cache]`` section)."""

    def __post_init__(self) -> None:
        if not isinstance(self.io_options, StoreOptions):
            raise ConfigError("options: io_options must be a StoreOptions")
        for name, (least, most) in _BOUNDS.items():
            value = getattr(self, name)
            if value is None and name == "lanes":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"options: {name} must be an integer >= {least}, "
                                  f"got {value!r}")
            if value > most:
                raise ConfigError(f"options: {name} = {value} is more than {most}, the most "
                                  "this option allows")
        timeout = self.startup_timeout_s
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 0 < timeout < float("inf")):
            raise ConfigError(f"options: startup_timeout_s must be a number of seconds > 0, "
                              f"got {timeout!r}")
        if self.dp_rank >= self.dp_world_size:
            raise ConfigError(f"options: dp_rank={self.dp_rank} must be < dp_world_size="
                              f"{self.dp_world_size}")

    @property
    def resolved_lanes(self) -> int:
        return self.lanes if self.lanes is not None else self.dp_world_size


def lanes_problem(lanes: int, dp_size: int) -> str | None:
    """Why ``dp_size`` data-parallel readers cannot share ``lanes``, naming the sizes that
    can; None when they can. The one wording of this error in the core and the adapters."""
    if lanes >= 1 and dp_size >= 1 and lanes % dp_size == 0:
        return None
    divisors = [d for d in range(1, lanes + 1) if lanes % d == 0] if lanes >= 1 else []
    return (f"{lanes} lanes cannot be shared by {dp_size} data-parallel readers: the data-"
            f"parallel size must divide the lanes ({divisors[:24]})")
