"""``shuffle``: a seeded buffer shuffle of records (normally packed rows).

Algorithm: fill a buffer of ``buffer_size`` records; then for every new record, emit the
buffered record at a uniformly drawn index and put the new one in its place. At a flush the
buffer is emitted in a drawn order. The generator (PCG64, seeded from the pipeline seed, the
lane and ``seed``) is part of the lane state, so a resumed lane draws the same indices.

Limits: this is a local shuffle. A record leaves the buffer after ``buffer_size`` draws on
average but may wait longer; records far apart in the input never swap. Memory and checkpoint
size grow linearly with ``buffer_size`` (a 2049-token row is 8 KiB of tokens plus positions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError
from zephon.field_checks import (
    StateFieldError,
    item,
    need_fields,
    need_int,
    need_list,
    need_str,
    record_from_state,
    within,
)
from zephon.ops.base import BufferedNode, BuildContext, Node, OperatorSpec, RowOperator
from zephon.records import Record


@dataclass(frozen=True)
class ShuffleSpec(OperatorSpec):
    """Options of ``shuffle``."""

    op_name: ClassVar[str] = "shuffle"
    title: ClassVar[str] = "shuffle"
    stage: ClassVar[str] = "row"

    buffer_size: int
    """Records held for shuffling."""
    seed: int = 0
    """Mixed with the pipeline seed and the lane index."""

    def __post_init__(self) -> None:
        if not isinstance(self.buffer_size, int) or self.buffer_size <= 0:
            raise ConfigError(f"shuffle: buffer_size must be a positive integer, "
                              f"got {self.buffer_size!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"shuffle: seed must be an integer, got {self.seed!r}")

    def build(self, context: BuildContext) -> ShuffleOperator:
        return ShuffleOperator(self, context.seed)


class ShuffleOperator(RowOperator):
    def __init__(self, spec: ShuffleSpec, base_seed: int):
        super().__init__(spec)
        self.spec: ShuffleSpec = spec
        self.base_seed = base_seed

    def node(self, upstream: Node, lane: int) -> ShuffleNode:
        return ShuffleNode(upstream, Shuffler(self.spec, self.base_seed, lane))


class ShuffleNode(BufferedNode):
    """Pulls rows through the shuffle buffer; at the end of its input emits the buffer."""

    algorithm: Shuffler

    def algorithm_snapshot(self) -> dict[str, Any]:
        return {"shuffler": self.algorithm.snapshot()}

    def algorithm_restore(self, state: dict[str, Any]) -> None:
        state = need_fields(state, "", ("shuffler", "out", "ended"))
        with within("shuffler"):
            self.algorithm.restore(state["shuffler"], self.check_output)
        if state["ended"] and self.algorithm.held():
            raise StateFieldError("shuffler.buffer", "holds rows, but ended is true: the "
                                                     "buffer is emitted when the input ends")


class Shuffler:
    """The buffer shuffle for one lane (see the module docstring)."""

    def __init__(self, spec: ShuffleSpec, base_seed: int, lane: int):
        self.spec = spec
        self._rng = np.random.Generator(np.random.PCG64([base_seed, lane, spec.seed, 0x5F]))
        self._buffer: list[Record] = []

    def snapshot(self) -> dict[str, Any]:
        return {"buffer": [r.to_plain() for r in self._buffer],
                "rng": self._rng.bit_generator.state}

    def restore(self, state: dict[str, Any],
                check: Callable[[Record, str], None] | None = None) -> None:
        """Continue from ``state``: at most ``buffer_size`` records (each passed to
        ``check`` with its path, when given) and a PCG64 state."""
        state = need_fields(state, "", ("buffer", "rng"))
        saved = need_list(state["buffer"], "buffer")
        if len(saved) > self.spec.buffer_size:
            raise StateFieldError("buffer", f"holds {len(saved)} rows, more than "
                                            f"buffer_size={self.spec.buffer_size}")
        buffer = [record_from_state(r, item("buffer", i)) for i, r in enumerate(saved)]
        if check is not None:
            for i, record in enumerate(buffer):
                check(record, item("buffer", i))
        self._rng.bit_generator.state = _rng_state(state["rng"], "rng")
        self._buffer = buffer

    def held(self) -> int:
        """Records in the buffer."""
        return len(self._buffer)

    def add(self, record: Record) -> list[Record]:
        if len(self._buffer) < self.spec.buffer_size:
            self._buffer.append(record)
            return []
        index = int(self._rng.integers(len(self._buffer)))
        out = self._buffer[index]
        self._buffer[index] = record
        return [out]

    def flush(self) -> list[Record]:
        order = self._rng.permutation(len(self._buffer))
        out = [self._buffer[i] for i in order]
        self._buffer = []
        return out


def _rng_state(value: Any, path: str) -> dict[str, Any]:
    """``value`` checked as a PCG64 ``bit_generator.state``: 128-bit state and increment (odd,
    as PCG64 makes it) and a buffered 32-bit half (numpy takes any value of the right key
    names, and fails on the rest with its own errors)."""
    value = need_fields(value, path, ("bit_generator", "state", "has_uint32", "uinteger"))
    if need_str(value["bit_generator"], f"{path}.bit_generator") != "PCG64":
        raise StateFieldError(f"{path}.bit_generator",
                              f"is {value['bit_generator']!r}, must be 'PCG64'")
    inner = need_fields(value["state"], f"{path}.state", ("state", "inc"))
    need_int(inner["state"], f"{path}.state.state", high=2**128 - 1)
    if need_int(inner["inc"], f"{path}.state.inc", high=2**128 - 1) % 2 == 0:
        raise StateFieldError(f"{path}.state.inc", f"is {inner['inc']}, must be odd")
    need_int(value["has_uint32"], f"{path}.has_uint32", high=1)
    need_int(value["uinteger"], f"{path}.uinteger", high=2**32 - 1)
    return value
