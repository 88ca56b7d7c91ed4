"""One dataset's document stream inside one lane.

The stream reads the lane's units of the dataset in the work source's order, the rows of each
unit in their seeded order, and (when the pipeline tokenizes) encodes ``batch_size`` texts per
backend call ahead of the mixer. Its state is only the position of the next document the mixer
has not taken, ``(k, row, piece)``: the k-th unit of this lane, the row inside the unit's order,
the piece of a split document. Documents read ahead are not state: a restore reads the unit
again from that position, so restoring costs at most one unit read, never a replay.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from zephon.io.formats import read_unit
from zephon.ops.pack import Doc
from zephon.ops.tokenize import RowEncoder
from zephon.records import Record
from zephon.work.source import StaticMixtureWorkSource

Position = tuple[int, int, int]
# Read-ahead starts small and doubles up to the tokenize batch size, so the first batch does
# not wait for a full batch of documents to be encoded (the output is the same either way).
_FIRST_CHUNK = 8


class _LoadedUnit:
    __slots__ = ("columns", "display", "epoch", "file_index", "k", "keys", "order")

    def __init__(self, k: int, epoch: int, columns: dict[str, list[Any]], keys: list[int],
                 order: np.ndarray, file_index: int, display: str):
        self.k, self.epoch, self.columns, self.keys, self.order = k, epoch, columns, keys, order
        self.file_index, self.display = file_index, display


class ComponentStream:
    """Documents of dataset ``index`` for ``lane`` of ``lanes``; see the module docstring."""

    def __init__(self, source: StaticMixtureWorkSource, index: int, lane: int, lanes: int,
                 tokenizer: RowEncoder | None, chunk: int = 256):
        self.source = source
        self.index = index
        self.dataset = source.datasets[index]
        self.name = self.dataset.name
        self.lane, self.lanes = lane, lanes
        self.tokenizer = tokenizer
        self.columns = tokenizer.columns if tokenizer is not None else None
        self.chunk = chunk
        self._next_chunk = min(chunk, _FIRST_CHUNK)
        self.position: Position = (0, 0, 0)
        self.skipped: dict[str, int] = {}
        self.epoch = 0
        self._read: Position = (0, 0, 0)
        self._ahead: deque[tuple[Doc | Record | None, Position, int]] = deque()
        self._unit: _LoadedUnit | None = None
        self._exhausted = False

    # -- state -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"position": self.position, "skipped": dict(self.skipped), "epoch": self.epoch}

    def restore(self, state: dict[str, Any]) -> None:
        self.position = tuple(state["position"])
        self.skipped = dict(state["skipped"])
        self.epoch = state["epoch"]
        self._read = self.position
        self._next_chunk = min(self.chunk, _FIRST_CHUNK)
        self._ahead.clear()
        self._exhausted = False

    # -- reading ---------------------------------------------------------------------------
    def next(self) -> Doc | Record | None:
        """The next document, or None when this lane's share of the dataset is read."""
        while True:
            if not self._ahead and not self._fill():
                return None
            item, after, epoch = self._ahead.popleft()
            self.position = after
            self.epoch = epoch
            if isinstance(item, str):
                self.skipped[item] = self.skipped.get(item, 0) + 1
                continue
            return item

    def _load(self, k: int) -> _LoadedUnit | None:
        if self._unit is not None and self._unit.k == k:
            return self._unit
        found = self.source.unit_at(self.index, self.lane, k, self.lanes)
        if found is None:
            return None
        epoch, unit_index, (file_index, spec) = found
        data_file = self.dataset.files()[file_index]
        display = self.dataset.display_name(data_file)
        with self.dataset.local_file(data_file) as local:
            table, keys = read_unit(local, data_file.fmt, data_file.compression, spec,
                                    self.columns, display)
        order = self.source.row_order(self.index, epoch, unit_index, len(keys))
        self._unit = _LoadedUnit(k, epoch, table, keys, order, file_index, display)
        return self._unit

    def _fill(self) -> bool:
        if self._exhausted:
            return False
        k, row, skip = self._read
        values: list[tuple[Any, ...]] = []
        labels: list[str] = []
        where: list[tuple[int, int, int, str, int]] = []  # k, row, skip, doc_id, epoch
        rows_out: list[Record] = []
        chunk = self._next_chunk
        self._next_chunk = min(self.chunk, chunk * 2)
        while len(where) < chunk:
            unit = self._load(k)
            if unit is None:
                self._exhausted = True
                break
            n = len(unit.keys)
            while row < n and len(where) < chunk:
                r = int(unit.order[row])
                doc_id = f"{self.name}:{unit.file_index}:{unit.keys[r]}"
                if unit.epoch:  # a repeated dataset's documents come back once per epoch
                    doc_id += f"#e{unit.epoch}"
                if self.columns is None:
                    payload = {c: v[r] for c, v in unit.columns.items()}
                    rows_out.append(Record(payload, {"id": doc_id, "dataset": self.name}))
                else:
                    values.append(tuple(unit.columns[c][r] for c in self.columns))
                    labels.append(f"{unit.display}: row {unit.keys[r]}")
                where.append((k, row, skip, doc_id, unit.epoch))
                row += 1
                skip = 0
            if row >= n:
                k, row = k + 1, 0
        self._read = (k, row, 0)
        if not where:
            return False
        if self.columns is None:
            for (wk, wrow, _, _, epoch), record in zip(where, rows_out, strict=True):
                self._ahead.append((record, (wk, wrow + 1, 0), epoch))
            return True
        encoded = self.tokenizer.encode_rows(values, labels)
        for (wk, wrow, wskip, doc_id, epoch), row_out in zip(where, encoded, strict=True):
            parts = row_out.pieces
            if row_out.skipped is not None:
                self._ahead.append((row_out.skipped, (wk, wrow + 1, 0), epoch))
                continue
            offset = sum(len(p) for p in parts[:wskip])
            for p in range(wskip, len(parts)):
                after = (wk, wrow, p + 1) if p + 1 < len(parts) else (wk, wrow + 1, 0)
                mask = row_out.masks[p] if row_out.masks is not None else None
                doc = Doc(parts[p], doc_id, self.name, offset, mask)
                offset += len(parts[p])
                self._ahead.append((doc, after, epoch))
        return True
