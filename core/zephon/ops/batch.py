"""``batch``: group rows into SampleBatch objects of ``microbatch_size``; always the last
operator.

At a flush (the end of a lane's data) a short batch is emitted only with ``drop_last=False``;
otherwise its rows are dropped and counted (rows, documents starting in them, tokens) in the
pipeline report and logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.batch import SampleBatch
from zephon.errors import ConfigError
from zephon.ops.base import BuildContext, Node, OperatorSpec, RowOperator
from zephon.records import Record, record_counts
from zephon.redact import get_logger
from zephon.state_checks import need_counts, need_fields, need_int

log = get_logger(__name__)


@dataclass(frozen=True)
class BatchSpec(OperatorSpec):
    """Options of ``batch``."""

    op_name: ClassVar[str] = "batch"
    title: ClassVar[str] = "batch"
    stage: ClassVar[str] = "batch"

    microbatch_size: int
    """Records per SampleBatch."""
    drop_last: bool = True
    """Drop (and count) a short batch at a flush instead of emitting it."""

    def __post_init__(self) -> None:
        if not isinstance(self.microbatch_size, int) or self.microbatch_size <= 0:
            raise ConfigError(f"batch: microbatch_size must be a positive integer, "
                              f"got {self.microbatch_size!r}")

    def build(self, context: BuildContext) -> BatchOperator:
        return BatchOperator(self)


class BatchOperator(RowOperator):
    def __init__(self, spec: BatchSpec):
        super().__init__(spec)
        self.spec: BatchSpec = spec

    def node(self, upstream: Node, lane: int) -> BatchNode:
        return BatchNode(self.spec, upstream, lane)


class BatchNode(Node):
    def __init__(self, spec: BatchSpec, upstream: Node, lane: int):
        self.spec = spec
        self.upstream = upstream
        self.lane = lane
        self.made = 0
        self.dropped = {"rows": 0, "documents": 0, "tokens": 0}

    def next(self) -> SampleBatch | None:
        size = self.spec.microbatch_size
        records: list[Record] = []
        while len(records) < size:
            record = self.upstream.next()
            if record is None:
                break
            records.append(record)
        if not records or (len(records) < size and self.spec.drop_last):
            self._drop(records)
            return None
        batch = SampleBatch(records, lane=self.lane, index=self.made)
        self.made += 1
        return batch

    def _drop(self, records: list[Record]) -> None:
        if not records:
            return
        documents = tokens = 0
        for record in records:
            d, t = record_counts(record)
            documents, tokens = documents + d, tokens + t
        self.dropped["rows"] += len(records)
        self.dropped["documents"] += documents
        self.dropped["tokens"] += tokens
        log.warning("zephon: lane %d dropped a short batch of %d row(s) (%d documents, %d tokens) "
                 "at the end of its data (drop_last=True)", self.lane, len(records), documents,
                 tokens)

    def snapshot(self) -> dict[str, Any]:
        return {"made": self.made, "stats": {"dropped": dict(self.dropped)}}

    def restore(self, state: dict[str, Any]) -> None:
        state = need_fields(state, "", ("made", "stats"))
        made = need_int(state["made"], "made")
        stats = need_fields(state["stats"], "stats", ("dropped",))
        self.dropped = need_counts(stats["dropped"], "stats.dropped", tuple(self.dropped))
        self.made = made
