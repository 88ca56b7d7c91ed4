"""A lane: one deterministic pipeline, read -> tokenize -> mix -> pack -> shuffle -> batch.

A lane's output is a pure function of the recipe, the seed, the lane count and the lane index.
It is driven synchronously by whichever thread asks for the next microbatch; timing, threads
and prefetch depth cannot change it. After every microbatch the lane can produce a snapshot of
its state (positions, mixer counts, open rows, shuffle buffer), built from immutable pieces so
that taking it costs microseconds and later work never changes it.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.component import ComponentStream
from zephon.engine.mixer import DeficitMixer
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import Doc, Packer, PackSpec
from zephon.ops.shuffle import Shuffler, ShuffleSpec
from zephon.ops.tokenize import RowEncoder
from zephon.records import DocSpan, Record
from zephon.work.source import StaticMixtureWorkSource


@dataclass(frozen=True)
class LanePlan:
    """Everything a lane needs, shared by all lanes of a pipeline."""

    source: StaticMixtureWorkSource
    tokenizer: RowEncoder | None
    pack: PackSpec | None
    pad_token_id: int
    shuffle: ShuffleSpec | None
    batch: BatchSpec
    lanes: int


def _new_counters(names: list[str]) -> dict[str, Any]:
    return {
        "documents": dict.fromkeys(names, 0),
        "tokens": dict.fromkeys(names, 0),
        "dropped": {"rows": 0, "documents": 0, "tokens": 0},
        "padding_tokens": 0,
    }


class Lane:
    def __init__(self, plan: LanePlan, lane: int):
        self.plan = plan
        self.lane = lane
        source = plan.source
        chunk = plan.tokenizer.spec.batch_size if plan.tokenizer is not None else 256
        self.components = [ComponentStream(source, i, lane, plan.lanes, plan.tokenizer, chunk)
                           for i in range(len(source.datasets))]
        self.mixer = DeficitMixer(source.weights)
        self.packer = Packer(plan.pack, plan.pad_token_id, lane) if plan.pack else None
        self.shuffler = Shuffler(plan.shuffle, source.seed, lane) if plan.shuffle else None
        self.microbatches = 0
        self.counters = _new_counters(source.names())
        self._out: deque[Record] = deque()
        self._data_ended = False
        self._flushed = False

    # -- state -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "microbatches": self.microbatches,
            "components": [c.snapshot() for c in self.components],
            "mixer": self.mixer.snapshot(),
            "packer": self.packer.snapshot() if self.packer else None,
            "shuffler": self.shuffler.snapshot() if self.shuffler else None,
            "out": list(self._out),
            "data_ended": self._data_ended,
            "flushed": self._flushed,
            "counters": copy.deepcopy(self.counters),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.microbatches = state["microbatches"]
        for component, saved in zip(self.components, state["components"], strict=True):
            component.restore(saved)
        self.mixer.restore(state["mixer"])
        if self.packer:
            self.packer.restore(state["packer"])
        if self.shuffler:
            self.shuffler.restore(state["shuffler"])
        self._out = deque(state["out"])
        self._data_ended = state["data_ended"]
        self._flushed = state["flushed"]
        self.counters = copy.deepcopy(state["counters"])

    # -- producing -------------------------------------------------------------------------
    def next_microbatch(self) -> SampleBatch | None:
        size = self.plan.batch.microbatch_size
        while len(self._out) < size and not self._flushed:
            self._advance()
        if len(self._out) >= size:
            records = [self._out.popleft() for _ in range(size)]
        elif self._out and not self.plan.batch.drop_last:
            records = list(self._out)
            self._out.clear()
        else:
            self._drop(self._out)
            self._out.clear()
            return None
        batch = SampleBatch(records, lane=self.lane, index=self.microbatches)
        self.microbatches += 1
        return batch

    def _drop(self, records: deque[Record]) -> None:
        dropped = self.counters["dropped"]
        for record in records:
            dropped["rows"] += 1
            spans = record.meta.get("documents", ())
            dropped["documents"] += sum(1 for s in spans if s.doc_start == 0) or (0 if spans
                                                                                   else 1)
            dropped["tokens"] += sum(s.length for s in spans)

    def _advance(self) -> None:
        if not self._data_ended:
            doc = self._next_document()
            if doc is not None:
                self._push(self.packer.add(doc) if self.packer else [_as_record(doc, self.lane)])
                return
            self._data_ended = True
        self._push(self.packer.flush() if self.packer else [])
        if self.shuffler:
            self._out.extend(self.shuffler.flush())
        if self.packer:
            self.counters["padding_tokens"] = self.packer.padding_tokens
        self._flushed = True

    def _push(self, rows: list[Record]) -> None:
        if self.packer:
            self.counters["padding_tokens"] = self.packer.padding_tokens
        if self.shuffler is None:
            self._out.extend(rows)
            return
        for row in rows:
            self._out.extend(self.shuffler.add(row))

    def _next_document(self) -> Doc | Record | None:
        source = self.plan.source
        while True:
            index = self.mixer.choose()
            if index is None:
                return None
            doc = self.components[index].next()
            if doc is None:
                if source.on_exhausted == "stop":
                    return None
                self.mixer.deactivate(index)
                continue
            name = source.datasets[index].name
            if isinstance(doc, Doc):
                tokens = len(doc.tokens)
                self.counters["tokens"][name] += tokens
                if doc.doc_start == 0:
                    self.counters["documents"][name] += 1
                self.mixer.record(index, tokens if source.by_tokens else
                                  int(doc.doc_start == 0))
            else:
                self.counters["documents"][name] += 1
                self.mixer.record(index, 1)
            return doc


def _as_record(doc: Doc | Record, lane: int) -> Record:
    if isinstance(doc, Record):
        doc.meta["lane"] = lane
        return doc
    payload = {"input_ids": doc.tokens}
    if doc.train_mask is not None:
        payload["train_mask"] = doc.train_mask
    span = DocSpan(doc.doc_id, doc.dataset, doc.doc_start, 0, len(doc.tokens))
    meta = {"id": f"{doc.doc_id}@{doc.doc_start}", "dataset": doc.dataset, "lane": lane,
            "documents": (span,), "padding": 0}
    return Record(payload, meta)
