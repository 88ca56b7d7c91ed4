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

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError
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
        return ShuffleNode(Shuffler(self.spec, self.base_seed, lane), upstream)


class ShuffleNode(BufferedNode):
    """Pulls rows through the shuffle buffer; at the end of its input emits the buffer."""

    def __init__(self, shuffler: Shuffler, upstream: Node):
        super().__init__(upstream)
        self.shuffler = shuffler

    def push(self, item: Record) -> list[Record]:
        return self.shuffler.add(item)

    def flush(self) -> list[Record]:
        return self.shuffler.flush()

    def algorithm_snapshot(self) -> dict[str, Any]:
        return {"shuffler": self.shuffler.snapshot()}

    def algorithm_restore(self, state: dict[str, Any]) -> None:
        self.shuffler.restore(state["shuffler"])


class Shuffler:
    """The buffer shuffle for one lane (see the module docstring)."""

    def __init__(self, spec: ShuffleSpec, base_seed: int, lane: int):
        self.spec = spec
        self._rng = np.random.Generator(np.random.PCG64([base_seed, lane, spec.seed, 0x5F]))
        self._buffer: list[Record] = []

    def snapshot(self) -> dict[str, Any]:
        return {"buffer": [r.to_plain() for r in self._buffer],
                "rng": self._rng.bit_generator.state}

    def restore(self, state: dict[str, Any]) -> None:
        self._buffer = [Record.from_plain(r) for r in state["buffer"]]
        self._rng.bit_generator.state = state["rng"]

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
