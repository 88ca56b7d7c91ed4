"""A lane: one deterministic chain of nodes, sources -> mixer -> row operators -> batch.

A lane's output is a pure function of the recipe, the seed, the lane count and the lane index.
It is driven synchronously by whichever thread asks for the next microbatch; timing, threads
and prefetch depth cannot change it. After every microbatch the lane can produce a snapshot of
its state: the snapshot of every node in chain order, as plain data, taken in microseconds and
never changed by later work. The lane runs whatever chain its plan builds and names no
operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.mixer import MixNode
from zephon.engine.source import DatasetSource, Offload
from zephon.errors import StateMismatchError
from zephon.ops.base import DocumentOperator, Node, RowOperator, applies_to
from zephon.records import Doc, Record, doc_as_record
from zephon.work.source import StaticMixtureWorkSource


class DocumentRows(Node):
    """Each document as a row of its own, for chains without a packing operator."""

    def __init__(self, upstream: Node, lane: int):
        self.upstream = upstream
        self.lane = lane

    def next(self) -> Record | None:
        doc: Doc | None = self.upstream.next()
        return doc_as_record(doc, self.lane) if doc is not None else None

    def snapshot(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class LanePlan:
    """The built operators of a pipeline, shared by all its lanes."""

    source: StaticMixtureWorkSource
    document_ops: tuple[DocumentOperator, ...]
    """Applied inside the dataset sources they apply to, in order."""
    row_ops: tuple[RowOperator, ...]
    """One node each per lane after the mixer, in order; the last one makes microbatches."""
    makes_rows: bool
    """Whether the first row operator turns documents into rows (else DocumentRows does)."""
    lanes: int
    workers: Offload | None = None
    """Worker processes or the document threads for the document operators (None: the lanes'
    own thread)."""

    def ops_of(self, dataset: int) -> list[DocumentOperator]:
        """The document operators that apply to dataset number ``dataset``."""
        name = self.source.datasets[dataset].name
        return [op for op in self.document_ops if applies_to(op.spec, name)]

    def chain(self, lane: int) -> list[Node]:
        """The nodes of ``lane``, upstream first."""
        source = self.source
        sources = [DatasetSource(source, i, lane, self.lanes, self.ops_of(i), self.workers)
                   for i in range(len(source.datasets))]
        nodes: list[Node] = [MixNode(sources, source.weights, source.by_tokens,
                                     source.on_exhausted)]
        if not self.makes_rows:
            nodes.append(DocumentRows(nodes[-1], lane))
        for op in self.row_ops:
            nodes.append(op.node(nodes[-1], lane))
        return nodes


class Lane:
    def __init__(self, plan: LanePlan, lane: int):
        self.lane = lane
        self.nodes = plan.chain(lane)
        self.microbatches = 0

    def snapshot(self) -> dict[str, Any]:
        return {"microbatches": self.microbatches,
                "nodes": [node.snapshot() for node in self.nodes]}

    def restore(self, state: dict[str, Any]) -> None:
        if len(state["nodes"]) != len(self.nodes):
            raise StateMismatchError(f"lane {self.lane}: the checkpoint holds "
                                     f"{len(state['nodes'])} operator states, this pipeline "
                                     f"has {len(self.nodes)}")
        for node, saved in zip(self.nodes, state["nodes"], strict=True):
            node.restore(saved)
        self.microbatches = state["microbatches"]

    def next_microbatch(self) -> SampleBatch | None:
        batch = self.nodes[-1].next()
        if batch is not None:
            self.microbatches += 1
        return batch
