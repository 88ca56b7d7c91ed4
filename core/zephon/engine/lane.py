"""A lane: one deterministic chain of nodes, sources -> mixer -> row operators -> batch.

A lane's output is a pure function of the recipe, the seed, the lane count and the lane index.
It is driven synchronously by whichever thread asks for the next microbatch; timing, threads
and prefetch depth cannot change it. After every microbatch the lane can produce a snapshot of
its state: the snapshot of every node in chain order, as plain data, taken in microseconds and
never changed by later work. The lane runs whatever chain its plan builds and names no
operator.

A restore trusts nothing: each node checks its own part of the snapshot (types, ranges, its
plan) and the lane checks what holds between them. A node that reads the mixer, through
nodes that only pass documents on, sees the mixer end in the same call, so their ``ended``
flags agree; a buffered node ends only after its upstream has ended and handed on all it
held; the batch node's count of microbatches is the lane's. Custom nodes are checked by their
own ``restore``; what they raise is reported as their part of the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.engine.dataset_source import DatasetSource, Offload
from zephon.engine.loader_state import from_portable
from zephon.engine.mixer import MixNode
from zephon.engine.unit_reads import UnitReads
from zephon.field_checks import (
    StateFieldError,
    item,
    need_fields,
    need_int,
    need_list,
    token_limit,
    within,
)
from zephon.ops.base import BufferedNode, DocumentOperator, Node, RowOperator, applies_to
from zephon.ops.batch import BatchNode
from zephon.records import Doc, Record, doc_as_record
from zephon.sample_batch import SampleBatch
from zephon.work.protocol import WorkSource


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
        need_fields(state, "", ())


@dataclass(frozen=True)
class LanePlan:
    """The built operators of a pipeline, shared by all its lanes."""

    source: WorkSource
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
    unit_reads: UnitReads | None = None
    """The thread reading the sources' next units ahead (None: each source reads its own)."""

    @property
    def id_limit(self) -> int | None:
        """Every token id the lanes make is below this: the largest vocabulary of the
        document operators (None: they make no ids)."""
        limits = [op.id_limit for op in self.document_ops if op.id_limit is not None]
        return max(limits, default=None)

    def ops_of(self, dataset: int) -> list[DocumentOperator]:
        """The document operators that apply to dataset number ``dataset``."""
        name = self.source.names()[dataset]
        return [op for op in self.document_ops if applies_to(op.spec, name)]

    def chain(self, lane: int) -> list[Node]:
        """The nodes of ``lane``, upstream first."""
        source = self.source
        sources = [DatasetSource(work, i, lane, self.lanes, self.ops_of(i), self.workers,
                                 self.unit_reads)
                   for i, work in enumerate(source.work(self.lanes))]
        nodes: list[Node] = [MixNode(sources, source.schedule, source.by_tokens,
                                     source.on_exhausted, self.lanes)]
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
        self.drained = False
        """Whether the restored snapshot was taken after the lane's data ended (every node
        ended, nothing held for output)."""

    def snapshot(self) -> dict[str, Any]:
        return {"microbatches": self.microbatches,
                "nodes": [node.snapshot() for node in self.nodes]}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue after the snapshot ``state``; a state that this lane could not have
        written raises :class:`StateFieldError` naming the field (see the module
        docstring)."""
        state = need_fields(state, "", ("microbatches", "nodes"))
        microbatches = need_int(state["microbatches"], "microbatches")
        saved = need_list(state["nodes"], "nodes")
        if len(saved) != len(self.nodes):
            raise StateFieldError("nodes", f"holds {len(saved)} operator states, this "
                                           f"pipeline has {len(self.nodes)}")
        for i, (node, part) in enumerate(zip(self.nodes, saved, strict=True)):
            _restore_node(node, part, item("nodes", i))
        _check_ends(self.nodes, saved)
        last = self.nodes[-1]
        if isinstance(last, BatchNode) and last.made != microbatches:
            raise StateFieldError("microbatches", f"is {microbatches}, but the batch operator "
                                                  f"(nodes[{len(saved) - 1}]) made {last.made}")
        self.microbatches = microbatches
        self.drained = _drained(self.nodes, saved)

    def next_microbatch(self) -> SampleBatch | None:
        batch = self.nodes[-1].next()
        if batch is not None:
            self.microbatches += 1
        return batch


def restored_lane(plan: LanePlan, lane: int, saved: Any) -> tuple[dict[str, Any], Lane]:
    """``saved`` (a lane's portable snapshot) decoded, and a fresh lane of ``plan`` restored
    from it, so that a state that does not fit raises :class:`StateFieldError` before any
    stream uses it."""
    state = from_portable(saved)
    trial = Lane(plan, lane)
    with token_limit(plan.id_limit):
        trial.restore(state)
    return state, trial


_NODE_ERRORS = (AttributeError, LookupError, OverflowError, TypeError, ValueError)
"""What a node's own restore raises on a state it does not check (KeyError, TypeError, ...)."""


def _restore_node(node: Node, state: Any, path: str) -> None:
    """``node.restore(state)``, its refusals reported at ``path``; a node that fails on its
    own (a custom node without checks) is reported there too."""
    try:
        with within(path):
            node.restore(state)
    except StateFieldError:
        raise
    except _NODE_ERRORS as exc:
        raise StateFieldError(path, f"does not fit {type(node).__name__}: "
                                    f"{type(exc).__name__}: {exc}") from None


def _check_ends(nodes: list[Node], states: list[Any]) -> None:
    """The ``ended`` flags of the mixer and buffered nodes, and what the buffered ones hold,
    as the module docstring says they must be. Nodes of other kinds hide their end, so the
    check restarts after them."""
    upstream: tuple[int, bool, bool, bool] | None = None  # index, ended, holds output, mixer
    for i, (node, state) in enumerate(zip(nodes, states, strict=True)):
        if isinstance(node, DocumentRows):
            continue
        if isinstance(node, MixNode):
            upstream = (i, state["ended"], False, True)
            continue
        if not isinstance(node, BufferedNode):
            upstream = None
            continue
        ended = state["ended"]
        if upstream is not None:
            j, upstream_ended, holds, mixer = upstream
            if mixer and ended != upstream_ended:
                raise StateFieldError(
                    item("nodes", i), f"ended is {_flag(ended)}, but the mixer it reads "
                    f"(nodes[{j}]) has ended {_flag(upstream_ended)}: both end in the same call")
            if ended and (not upstream_ended or holds):
                raise StateFieldError(
                    item("nodes", i), f"ended is true, but its upstream nodes[{j}] has "
                    + ("not ended" if not upstream_ended else "rows left to hand on"))
        upstream = (i, ended, bool(state["out"]), False)


def _drained(nodes: list[Node], states: list[Any]) -> bool:
    return all(state["ended"] and not state.get("out")
               for node, state in zip(nodes, states, strict=True)
               if isinstance(node, (MixNode, BufferedNode)))


def _flag(value: bool) -> str:
    return "true" if value else "false"
