"""``batch``: group rows into SampleBatch objects of ``microbatch_size``; always the last
operator.

At a flush (the end of a lane's data) a short batch is emitted only with ``drop_last=False``;
otherwise its rows are dropped and counted (rows, documents starting in them, tokens) in the
pipeline report and logged.

Every batch made is also counted as handed to the trainer (rows, padding, and per dataset the
documents starting in it and the tokens of its documents): the lane's state as of a consumed
microbatch then holds exactly what the trainer received, which the report shows apart from
what the lane had read (:mod:`zephon.report`). Counting costs one pass over the batch's
document spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.errors import ConfigError
from zephon.field_checks import need_counts, need_fields, need_int
from zephon.logs import get_logger
from zephon.ops.base import BuildContext, Node, OperatorSpec, RowOperator
from zephon.records import Record, record_counts
from zephon.sample_batch import SampleBatch

log = get_logger(__name__)


MAX_MICROBATCH_ROWS = 1 << 16
"""The most rows in one microbatch: far above any data-parallel rank's microbatch, and it stops
a typo from allocating a batch of terabytes."""


@dataclass(frozen=True)
class BatchSpec(OperatorSpec):
    """Options of ``batch``."""

    op_name: ClassVar[str] = "batch"
    title: ClassVar[str] = "batch"
    stage: ClassVar[str] = "batch"
    holes: ClassVar[tuple[str, ...]] = ("microbatch_size",)

    microbatch_size: int | None
    """Records per SampleBatch. None: open, for the framework to fill (a recipe's ``[batch]``
    without it, see :meth:`zephon.recipe.DataRecipe.resolve`); an open spec cannot be
    built."""
    drop_last: bool = True
    """Drop (and count) a short batch at a flush instead of emitting it."""

    def __post_init__(self) -> None:
        if self.microbatch_size is None:
            return
        if not isinstance(self.microbatch_size, int) or isinstance(self.microbatch_size, bool) \
                or self.microbatch_size <= 0:
            raise ConfigError(f"batch: microbatch_size must be a positive integer, "
                              f"got {self.microbatch_size!r}")
        if self.microbatch_size > MAX_MICROBATCH_ROWS:
            raise ConfigError(f"batch: microbatch_size = {self.microbatch_size} is more than "
                              f"{MAX_MICROBATCH_ROWS} rows, the most zephon batches")

    def build(self, context: BuildContext) -> BatchOperator:
        self.check_filled()
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
        self.handed: dict[str, Any] = _no_handed()

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
        self._count_handed(records)
        return batch

    def _count_handed(self, records: list[Record]) -> None:
        handed = self.handed
        documents, tokens = handed["documents"], handed["tokens"]
        handed["rows"] += len(records)
        for record in records:
            meta = record.meta
            handed["padding_tokens"] += meta.get("padding", 0)
            spans = meta.get("documents")
            if spans is None:  # an unpacked row: one document of its dataset
                name = meta.get("dataset", "")
                documents[name] = documents.get(name, 0) + 1
                continue
            for span in spans:
                tokens[span.dataset] = tokens.get(span.dataset, 0) + span.length
                if span.doc_start == 0:
                    documents[span.dataset] = documents.get(span.dataset, 0) + 1

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
        handed = self.handed
        return {"made": self.made, "stats": {"dropped": dict(self.dropped), "handed": {
            "rows": handed["rows"], "padding_tokens": handed["padding_tokens"],
            "documents": dict(handed["documents"]), "tokens": dict(handed["tokens"])}}}

    def restore(self, state: dict[str, Any]) -> None:
        """A state written before handed counts were kept restores with none: the report's
        handed figures then count from the resume on."""
        state = need_fields(state, "", ("made", "stats"))
        made = need_int(state["made"], "made")
        stats = need_fields(state["stats"], "stats", ("dropped",), optional=("handed",))
        dropped = need_counts(stats["dropped"], "stats.dropped", tuple(self.dropped))
        handed = _no_handed()
        if "handed" in stats:
            given = need_fields(stats["handed"], "stats.handed", tuple(handed))
            handed["rows"] = need_int(given["rows"], "stats.handed.rows")
            handed["padding_tokens"] = need_int(given["padding_tokens"],
                                                "stats.handed.padding_tokens")
            handed["documents"] = need_counts(given["documents"], "stats.handed.documents")
            handed["tokens"] = need_counts(given["tokens"], "stats.handed.tokens")
        self.dropped, self.handed, self.made = dropped, handed, made


def _no_handed() -> dict[str, Any]:
    return {"rows": 0, "padding_tokens": 0, "documents": {}, "tokens": {}}
