"""One dataset's documents inside one lane: the source node under the mixer.

The source reads the lane's units of the dataset in the order its work gives
(:class:`zephon.work.protocol.DatasetWork`) and the rows of each unit in their seeded order,
and runs the pipeline's document operators (map, filter, tokenize, ...) over them in
read-ahead batches, ahead of the mixer. Each row yields zero or
more documents (a long document may be split into pieces, a filter may drop it).

With ``options(workers=N)`` the batches go to worker processes
(:mod:`zephon.engine.workers`), up to ``N`` in flight; with ``workers=0`` and a producer thread
(``prefetch > 0``) they go to the rank's document threads
(:mod:`zephon.engine.document_threads`), one more in flight than there are threads, when one
of the operators releases the GIL for its work (tokenizing). Either way they come back in
submission order and nothing else changes.

State is only the position of the next document the mixer has not taken, ``(k, row, piece)``:
the k-th unit of this lane, the row inside the unit's order, the document among that row's
outputs. Documents read ahead are not state: a restore reads the unit again from that position
and re-applies the (pure) document operators, so restoring costs at most one unit read, never
a replay. Drops are counted by reason when the mixer moves past them.

A repeated dataset that yields no document would be re-read forever. So the source of a
repeated dataset watches, as batches come back, for a stretch without a document as long as
a whole pass of the lane over its units (``ceil(n / lanes)`` units of ``n``, at least one,
each read in full; or that many units in a row that hold no rows). A pass of one lane may
come up empty while other units hold documents (a sparse dataset, a filter that keeps few
files), so that alone is no error: the source then reads, in this thread, the units the lane
may ever be given (every unit when units are shuffled; see
:meth:`~zephon.work.protocol.DatasetWork.lane_units`) until one yields a document. If one does, the
lane goes on as before and the watch ends (the lane will reach that unit). If none does, no
document can ever come: a DataError names the dataset, the lane, the pass (units and rows)
and the drop reasons counted in it. The check costs the lane at most one extra read of the
dataset, once, and only where a stretch that long came up empty; its counts are not state.
A lane never lacks units of a repeated dataset (each of its positions in the endless unit
sequence is a unit, even with fewer units than lanes), so an empty pass is always rows read.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from zephon.engine.document_threads import DocumentThreads
from zephon.engine.loader_state import lane_key
from zephon.engine.transform import transform_documents
from zephon.engine.unit_reads import PendingUnit, UnitReads
from zephon.engine.workers import DocumentWorkers
from zephon.errors import DataError, StateMismatchError
from zephon.field_checks import StateFieldError, item, need_counts, need_fields, need_int, need_list
from zephon.ops.base import DocumentOperator, LazyPieces
from zephon.records import Doc
from zephon.work.protocol import DatasetWork, LaneUnit, UnitRows

Position = tuple[int, int, int]
Offload = DocumentWorkers | DocumentThreads
"""Where a source's read-ahead batches are transformed, when not in its own thread."""
_FIRST_CHUNK = 8
"""Documents in a source's first read-ahead batch, so the first microbatch does not wait for a
full batch to be encoded (batch sizes never change the tokens)."""
_CHUNK_GROWTH = 1.1
"""Each read-ahead batch is at most this much larger than the one before, up to the
operators' batch size. A source waits for a batch only after it has used up the one before,
so a producer that is a fraction f faster than its trainer keeps ahead only while batches
grow by less than 1 + f: doubling made a trainer at 80% of capacity wait at every step of
the ramp (``benchmarks/trainer_wait.py``). At 80% f is 0.25, and growth of 1.2 left a margin
of 4%, less than two ranks sharing two cores wobble by: two ranks at 80% of their capacity
sometimes waited once at the ramp's larger batches; with growth of 1.1 (a 14% margin) they
did not. The ramp from 8 to 256 documents then spans about 2,700 documents per source (about
1,900 until 6 KB documents fill ``CHUNK_CHARS``), with throughput unchanged within noise
(measured: docs/measurements.md)."""
_DEFAULT_CHUNK = 256
CHUNK_CHARS = 1 << 20
"""A read-ahead batch ends once its documents' text fields reach this many characters, so
one batch of long documents is not one long burst: 1 MiB of text is about 250k tokens, a
fraction of a second of tokenizing (with the GIL released) and about 130 MiB of the
tokenizer's working memory. Batch size never changes the tokens; with one document thread,
1 MiB batches were faster than 256 KiB ones (fewer calls, less idle tail per call) and 2 MiB
ones no faster (measured: docs/measurements.md)."""


def projected_columns(ops: Sequence[DocumentOperator]) -> list[str] | None:
    """The columns a source must read for ``ops``: those the operators before the first
    tokenizing one read (None: all columns)."""
    columns: list[str] = []
    for op in ops:
        if op.columns is None:
            return None
        columns += [c for c in op.columns if c not in columns]
        if op.spec.makes_tokens:
            return columns
    return None


class _LoadedUnit:
    __slots__ = ("columns", "epoch", "file_index", "k", "keys", "label", "order")

    def __init__(self, k: int, epoch: int, columns: dict[str, list[Any]], keys: list[int],
                 order: list[int], file_index: int, label: Callable[[int], Any]):
        self.k, self.epoch, self.columns, self.keys, self.order = k, epoch, columns, keys, order
        self.file_index, self.label = file_index, label


class _Ahead:
    """A document read ahead (or None for a row that yielded none), the position after it,
    its unit's epoch and the drops to count when the mixer passes it."""

    __slots__ = ("after", "doc", "drops", "epoch")

    def __init__(self, doc: Doc | None, after: Position, epoch: int, drops: list[str]):
        self.doc, self.after, self.epoch, self.drops = doc, after, epoch, drops


class _LazyRow:
    """A row whose documents are made as the mixer takes them (a long text's pieces): only
    the next one is held. ``skip`` pieces were taken before a resume; they are made again
    and dropped."""

    __slots__ = ("drops", "epoch", "k", "next_doc", "piece", "pieces", "row")

    def __init__(self, outputs: list[Doc | LazyPieces], k: int, row: int, skip: int,
                 epoch: int, drops: list[str]):
        self.pieces: Iterator[Doc] = itertools.chain.from_iterable(
            o if isinstance(o, LazyPieces) else (o,) for o in outputs)
        self.k, self.row, self.epoch, self.drops = k, row, epoch, drops
        for _ in range(skip):
            next(self.pieces, None)
        self.piece = skip
        self.next_doc = next(self.pieces, None)

    def take(self) -> tuple[Doc | None, Position]:
        """The next document (None: the row has none left) and the position after it."""
        doc = self.next_doc
        if doc is None:
            return None, (self.k, self.row + 1, 0)
        self.next_doc = next(self.pieces, None)
        self.piece += 1
        if self.next_doc is None:
            return doc, (self.k, self.row + 1, 0)
        return doc, (self.k, self.row, self.piece)


class DatasetSource:
    """Documents of dataset ``index`` for ``lane`` of ``lanes``; see the module docstring."""

    def __init__(self, work: DatasetWork, index: int, lane: int, lanes: int,
                 ops: Sequence[DocumentOperator], workers: Offload | None = None,
                 unit_reads: UnitReads | None = None):
        self.work = work
        self.index = index
        self.name = work.name
        self.lane, self.lanes = lane, lanes
        self.ops = list(ops)
        self.columns = projected_columns(self.ops)
        sizes = [op.batch_size for op in self.ops if op.batch_size]
        self.chunk = min(sizes) if sizes else _DEFAULT_CHUNK
        self._next_chunk = min(self.chunk, _FIRST_CHUNK)
        self.position: Position = (0, 0, 0)
        self.skipped: dict[str, int] = {}
        self.epoch = 0
        self._read: Position = (0, 0, 0)
        self._ahead: deque[_Ahead | _LazyRow] = deque()
        self._unit: _LoadedUnit | None = None
        self._next_unit: tuple[int, PendingUnit] | None = None
        """The unit (its k) read ahead for this source (:mod:`zephon.engine.unit_reads`)."""
        self._unit_reads = unit_reads
        self._reads_off_gil = getattr(work, "reads_off_gil", None) if unit_reads else None
        self._exhausted = False
        self.workers = workers if workers is not None and workers.takes(self.ops) else None
        self._in_flight: deque[tuple[list[tuple[int, int, int, int]], Future]] = deque()
        self._resumed: Position | None = None
        """The position restored and not yet read from (its row is checked then)."""
        self._watch = work.repeated
        """Whether to watch for a pass without a document (see the module docstring)."""
        self._pass_units = max(1, -(-work.unit_count() // lanes))
        self._dead_units = 0  # units read in full, since the last document, that yielded none
        self._empty_units = 0  # units in a row, as gathered, that held no rows
        self._watched_k: int | None = None  # the unit (k) the last settled row came from
        self._watched_alive = False  # whether it yielded a document

    # -- state -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"position": list(self.position), "skipped": dict(self.skipped),
                "epoch": self.epoch}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, refused unless its position is one this lane reaches:
        see :meth:`_check_position`."""
        state = need_fields(state, "", ("position", "skipped", "epoch"))
        k, row, piece = (need_int(v, item("position", i))
                         for i, v in enumerate(need_list(state["position"], "position", 3)))
        skipped = need_counts(state["skipped"], "skipped")
        epoch = need_int(state["epoch"], "epoch")
        self._check_position(k, row, piece, epoch)
        self.position = (k, row, piece)
        self.skipped = skipped
        self.epoch = epoch
        self._resumed = self.position
        self._read = self.position
        self._next_chunk = min(self.chunk, _FIRST_CHUNK)
        self._ahead.clear()
        self._exhausted = False
        self.discard_in_flight()

    def _check_position(self, k: int, row: int, piece: int, epoch: int) -> None:
        """Refuse a position outside the plan: unit ``k`` must be one the lane reads (fewer
        than its units of the dataset unless the dataset repeats), ``epoch`` that unit's epoch
        (or 0 before anything was read), and ``row`` at most the unit's row count where the
        plan knows it (Parquet, Arrow, Megatron units); a JSON Lines unit's rows are counted
        only when it is read (:meth:`_check_resumed`). A row past the last has no piece."""
        found = self.work.unit_at(self.lane, k)
        if found is None:
            count = self.work.units_of_lane(self.lane)
            raise StateFieldError("position[0]", f"is {k}, but lane {self.lane} reads "
                                                 f"{count} work unit(s) of dataset {self.name!r}"
                                                 f", which does not repeat (0 to {count - 1})")
        unit_epoch, rows = found.epoch, found.rows
        if epoch != unit_epoch and (k, row, piece, epoch) != (0, 0, 0, 0):
            raise StateFieldError("epoch", f"is {epoch}, but work unit {k} of lane "
                                           f"{self.lane} is read in epoch {unit_epoch} of "
                                           f"dataset {self.name!r}")
        if rows is not None and row > rows:
            raise StateFieldError("position[1]", f"is {row}, but work unit {k} of dataset "
                                                 f"{self.name!r} holds {rows} rows")
        if rows is not None and row == rows and piece:
            raise StateFieldError("position[2]", f"is {piece}, but position[1] is past the "
                                                 "last row, where there is no piece")

    def _check_resumed(self, unit: _LoadedUnit) -> None:
        """At the first read after a restore: the row of the restored position within the
        unit's rows (what :meth:`_check_position` could not count)."""
        k, row, piece = self._resumed
        self._resumed = None
        rows = len(unit.keys)
        if unit.k == k and (row > rows or (row == rows and piece)):
            raise StateMismatchError(
                f"loader state {lane_key(self.lane)!r}: nodes[0].sources[{self.index}]"
                f".position is [{k}, {row}, {piece}], but work unit {k} of dataset "
                f"{self.name!r} for this lane holds {rows} rows: the state does not fit "
                "this data")

    def __del__(self) -> None:
        self.discard_in_flight()

    def discard_in_flight(self) -> None:
        """Drop the batches sent to workers and not taken yet, and the unit read ahead."""
        if self._next_unit is not None:
            self._next_unit[1].drop()
            self._next_unit = None
        while self._in_flight:
            _, future = self._in_flight.popleft()
            self.workers.discard(future)

    # -- reading ---------------------------------------------------------------------------
    def next(self) -> Doc | None:
        """The next document, or None when this lane's share of the dataset is read."""
        while True:
            if not self._ahead and not self._fill():
                return None
            item = self._ahead[0]
            if isinstance(item, _LazyRow):
                doc, after = item.take()
                if item.next_doc is None:
                    self._ahead.popleft()
            else:
                doc, after = item.doc, item.after
                self._ahead.popleft()
            self.position, self.epoch = after, item.epoch
            if item.drops:
                for reason in item.drops:
                    self.skipped[reason] = self.skipped.get(reason, 0) + 1
                item.drops = []
            if doc is not None:
                return doc

    def peek(self) -> Doc | None:
        """The document :meth:`next` would return, left in place (None: none is left). Rows
        that yield no document on the way are passed as :meth:`next` would pass them (their
        drops counted), so the position stays that of the next document not taken."""
        while True:
            if not self._ahead and not self._fill():
                return None
            item = self._ahead[0]
            if isinstance(item, _LazyRow):
                if item.next_doc is not None:
                    return item.next_doc
                _, after = item.take()  # its pieces were all taken before a resume
            else:
                if item.doc is not None:
                    return item.doc
                after = item.after
            self._ahead.popleft()  # a row without documents
            self.position, self.epoch = after, item.epoch
            for reason in item.drops:
                self.skipped[reason] = self.skipped.get(reason, 0) + 1
            item.drops = []

    def _load(self, k: int) -> _LoadedUnit | None:
        if self._unit is not None and self._unit.k == k:
            return self._unit
        found = self.work.unit_at(self.lane, k)
        if found is None:
            return None
        self._fetch_ahead(k, found)
        pending, self._next_unit = self._next_unit, None
        if pending is not None and pending[0] == k:
            rows: UnitRows = pending[1].rows()
        else:
            if pending is not None:
                pending[1].drop()
            rows = self.work.read(found.index, self.columns)
        order = np.asarray(self.work.row_order(found, len(rows.keys))).tolist()
        self._unit = _LoadedUnit(k, found.epoch, rows.columns, rows.keys, order,
                                 found.container, rows.label)
        return self._unit

    FETCH_AHEAD = 2
    """Units past the one being read that the dataset's work is told come next (a remote
    dataset downloads their files in the background), so a lane seldom waits for a
    download."""

    def _fetch_ahead(self, k: int, current: LaneUnit) -> None:
        """Tell the dataset's work which of this lane's next units lie in other containers
        than the one being read."""
        ahead: list[LaneUnit] = []
        for later in range(k + 1, k + 1 + self.FETCH_AHEAD):
            found = self.work.unit_at(self.lane, later)
            if found is None:
                break
            if found.container != current.container:
                ahead.append(found)
        if ahead:
            self.work.fetch_ahead(ahead)

    def _fill(self) -> bool:
        """Transform the next read-ahead batch into :attr:`_ahead`; False at the end.

        Whether batches go to the workers is asked again per batch, since an operator's
        answer may change as it runs (a tokenizer that switches engines); batches already
        in flight come back first, so the order never changes."""
        if self.workers is None or (not self._in_flight and not self.workers.takes(self.ops)):
            batch = self._gather()
            if batch is None:
                return False
            docs, labels, where = batch
            self._settle(where, transform_documents(self.ops, docs, labels, lazy=True))
            return True
        while len(self._in_flight) < self.workers.in_flight and self.workers.takes(self.ops):
            batch = self._gather()
            if batch is None:
                break
            docs, labels, where = batch
            self._in_flight.append((where, self.workers.submit(self.index, docs, labels)))
        if not self._in_flight:
            return False
        where, future = self._in_flight.popleft()
        self._settle(where, self.workers.result(future))
        return True

    def _gather(self) -> tuple[list[Doc], list[Any], list[tuple[int, int, int, int]]] | None:
        """The next read-ahead batch: documents, their labels, where each came from."""
        if self._exhausted:
            return None
        k, row, skip = self._read
        docs: list[Doc] = []
        labels: list[Any] = []
        where: list[tuple[int, int, int, int]] = []  # k, row, pieces to skip, epoch
        chunk = self._next_chunk
        self._next_chunk = min(self.chunk, max(chunk + 1, int(chunk * _CHUNK_GROWTH)))
        chars = 0
        while len(docs) < chunk and chars < CHUNK_CHARS:
            unit = self._load(k)
            if unit is None:
                self._exhausted = True
                break
            if self._resumed is not None:
                self._check_resumed(unit)
            n = len(unit.keys)
            if self._watch and row == 0:
                self._empty_units = self._empty_units + 1 if n == 0 else 0
                if self._empty_units >= self._pass_units:
                    self._check_documents_exist()
            columns = unit.columns
            prefix = f"{self.name}:{unit.file_index}:"
            # a repeated dataset's documents come back once per epoch
            suffix = f"#e{unit.epoch}" if unit.epoch else ""
            keys, order, label, epoch = unit.keys, unit.order, unit.label, unit.epoch
            while row < n and len(docs) < chunk and chars < CHUNK_CHARS:
                key = keys[order[row]]
                fields = {c: values[order[row]] for c, values in columns.items()}
                for value in fields.values():
                    if isinstance(value, str):
                        chars += len(value)
                docs.append(Doc(None, f"{prefix}{key}{suffix}", self.name, fields=fields))
                labels.append(label(key))
                where.append((k, row, skip, epoch))
                row += 1
                skip = 0
            if row >= n:
                k, row = k + 1, 0
        self._read = (k, row, 0)
        if not self._exhausted:
            self._read_next_unit(k, row)
        if not docs:
            return None
        return docs, labels, where

    def _read_next_unit(self, k: int, row: int) -> None:
        """Have the unit after the one being read read ahead (:mod:`zephon.engine.unit_reads`):
        unit ``k + 1`` once the batches gather from unit ``k``, unit ``k`` when the batch just
        gathered ended with unit ``k - 1``. Asked as soon as a unit is begun: asked one batch
        before it was needed, the unit was often not read in time."""
        if row:
            if self._unit is None or self._unit.k != k:
                return
            k += 1
        if self._reads_off_gil is None or (self._next_unit is not None
                                           and self._next_unit[0] == k):
            return
        found = self.work.unit_at(self.lane, k)
        if found is None or not self._reads_off_gil(found.index):
            return
        if self._next_unit is not None:
            self._next_unit[1].drop()
        pending = self._unit_reads.ask(  # type: ignore[union-attr]
            functools.partial(self.work.read, found.index, self.columns))
        self._next_unit = (k, pending) if pending is not None else None

    def _settle(self, where: list[tuple[int, int, int, int]],
                rows: list[tuple[list[Doc], list[str]]]) -> None:
        for (wk, wrow, wskip, epoch), (outputs, drops) in zip(where, rows, strict=True):
            if len(outputs) == 1 and not wskip and not isinstance(outputs[0], LazyPieces):
                self._ahead.append(_Ahead(outputs[0], (wk, wrow + 1, 0), epoch, drops))
                continue  # the common row: one document
            if wskip:  # resumed inside this row: its drops were counted before
                drops = []
            if any(isinstance(o, LazyPieces) for o in outputs):
                self._ahead.append(_LazyRow(outputs, wk, wrow, wskip, epoch, drops))
                continue
            outputs = outputs[wskip:]
            if not outputs:
                self._ahead.append(_Ahead(None, (wk, wrow + 1, 0), epoch, drops))
                continue
            for p, doc in enumerate(outputs, start=wskip):
                last = p + 1 == wskip + len(outputs)
                after = (wk, wrow + 1, 0) if last else (wk, wrow, p + 1)
                self._ahead.append(_Ahead(doc, after, epoch, drops if p == wskip else []))
        if self._watch:
            self._watch_rows(where, rows)

    # -- a repeated dataset without documents ----------------------------------------------
    def _watch_rows(self, where: list[tuple[int, int, int, int]],
                    rows: list[tuple[list[Any], list[str]]]) -> None:
        """Count the units read in full without a document since the last one; after a
        whole pass of them, check that the dataset has documents for this lane at all."""
        for (wk, _, _, _), (outputs, _) in zip(where, rows, strict=True):
            if wk != self._watched_k:
                if self._watched_k is not None and not self._watched_alive:
                    self._dead_units += 1
                self._watched_k, self._watched_alive = wk, False
            if outputs:
                self._watched_alive = True
                self._dead_units = 0
        if self._dead_units >= self._pass_units:
            self._check_documents_exist()

    def _check_documents_exist(self) -> None:
        """Read the units this lane may be given until one yields a document (then stop
        watching), or raise a DataError saying that none does."""
        units = self.work.unit_count()
        reachable = self.work.lane_units(self.lane)
        rows = 0
        drops: dict[str, int] = {}
        for unit_index in reachable:
            columns, keys, label, container = self.work.read(unit_index, self.columns)
            for start in range(0, len(keys), self.chunk):
                part = range(start, min(start + self.chunk, len(keys)))
                docs = [Doc(None, f"{self.name}:{container}:{keys[r]}", self.name,
                            fields={c: values[r] for c, values in columns.items()})
                        for r in part]
                labels = [label(keys[r]) for r in part]
                for outputs, reasons in transform_documents(self.ops, docs, labels, lazy=True):
                    if outputs:
                        self._watch = False
                        return
                    for reason in reasons:
                        drops[reason] = drops.get(reason, 0) + 1
            rows += len(keys)
        raise DataError(self._no_documents_message(units, len(reachable), rows, drops))

    def _no_documents_message(self, units: int, reachable: int, rows: int,
                              drops: dict[str, int]) -> str:
        if reachable == units:
            scope = f"a whole pass over its {units} work unit(s)"
        else:
            scope = (f"lane {self.lane} of {self.lanes} is only ever given {reachable} of its "
                     f"{units} work units (units are not shuffled), and a whole pass over them")
        if rows == 0:
            found = "holds no rows"
        else:
            dropped = sum(drops.values())
            found = (f"read {rows} row(s) and yielded no document; dropped {dropped} "
                     f"({', '.join(f'{r}: {n}' for r, n in sorted(drops.items())) or 'none'})"
                     + (f", {rows - dropped} made no document" if rows > dropped else ""))
        advice = ("check its filters and text field, or do not repeat it" if reachable == units
                  else "shuffle units (shuffle_units=True), or check its filters")
        return (f"dataset {self.name!r} is repeated, so it would be read forever, but {scope} "
                f"{found}: {advice}")
