"""``UnitTable``: the work units of one dataset as columns, not one Python object per unit.

A unit is ``(file index, UnitSpec(kind, group, start, stop))``. Held as Python tuples, a unit
costs about 200 bytes (a tuple, a ``UnitSpec`` and five ints); a plan of 100,000 files of
10 units each would then take about 200 MB on every rank. As five numpy columns (int32 file,
uint8 kind, int32 group, int64 start and stop) it takes 25 bytes a unit: 25 MB for a million
units, and it serializes to bytes as it is (:meth:`to_bytes`), which is how one rank hands
its plan to the others. Indexing builds the ``(int, UnitSpec)`` pair of one unit on demand.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.io.formats import UnitSpec

KINDS = ("row_group", "rows", "bytes", "file")
"""Unit kinds, by their code in the ``kind`` column."""
_CODES = {kind: code for code, kind in enumerate(KINDS)}
_COLUMNS = (("file", np.int32), ("kind", np.uint8), ("group", np.int32), ("start", np.int64),
            ("stop", np.int64))
_MAGIC = b"ZUT1"


class UnitTable:
    """The units of one dataset, in plan order; indexes like a list of
    ``(file index, UnitSpec)``."""

    __slots__ = ("file", "group", "kind", "start", "stop")

    def __init__(self, file: np.ndarray, kind: np.ndarray, group: np.ndarray,
                 start: np.ndarray, stop: np.ndarray):
        self.file, self.kind, self.group, self.start, self.stop = file, kind, group, start, stop

    @classmethod
    def from_units(cls, units: Iterable[tuple[int, UnitSpec]]) -> UnitTable:
        """A table of ``units``; a UnitTable is returned as it is."""
        if isinstance(units, UnitTable):
            return units
        builder = UnitTableBuilder()
        for file_index, spec in units:
            builder.add(file_index, spec)
        return builder.table()

    def __len__(self) -> int:
        return len(self.file)

    def __getitem__(self, index: int) -> tuple[int, UnitSpec]:
        return int(self.file[index]), UnitSpec(KINDS[self.kind[index]], int(self.group[index]),
                                               int(self.start[index]), int(self.stop[index]))

    def __iter__(self) -> Iterator[tuple[int, UnitSpec]]:
        for index in range(len(self)):
            yield self[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnitTable) and all(
            np.array_equal(getattr(self, name), getattr(other, name)) for name, _ in _COLUMNS)

    __hash__ = None  # type: ignore[assignment]

    def rows(self) -> int | None:
        """The rows of all units, where every unit counts rows (Parquet row groups, Arrow
        rows, indexed documents); None where some unit is a byte range or a whole file."""
        counted = np.isin(self.kind, [_CODES["row_group"], _CODES["rows"]])
        if not counted.all():
            return None
        return int((self.stop - self.start).sum())

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name, _ in _COLUMNS)

    def digest(self) -> str:
        """16 hex digits of a SHA-256 over :meth:`to_bytes`: equal tables, equal digests, on
        any machine (checkpoints hold it)."""
        return hashlib.sha256(self.to_bytes()).hexdigest()[:16]

    def to_bytes(self) -> bytes:
        """The columns, little-endian, after a 12-byte header (magic and unit count)."""
        columns = [np.ascontiguousarray(getattr(self, name), dtype=np.dtype(kind).newbyteorder("<"))
                   for name, kind in _COLUMNS]
        return _MAGIC + len(self).to_bytes(8, "little") + b"".join(c.tobytes() for c in columns)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> UnitTable:
        """The table :meth:`to_bytes` wrote; anything else is a DataError."""
        view = memoryview(data)
        if bytes(view[:4]) != _MAGIC or len(view) < 12:
            raise DataError("not a zephon unit table (bad header)")
        count = int.from_bytes(view[4:12], "little")
        columns: dict[str, Any] = {}
        offset = 12
        for name, kind in _COLUMNS:
            dtype = np.dtype(kind).newbyteorder("<")
            size = count * dtype.itemsize
            if offset + size > len(view):
                raise DataError(f"zephon unit table cut short in column {name!r}")
            columns[name] = np.frombuffer(view[offset:offset + size], dtype=dtype).astype(kind)
            offset += size
        if offset != len(view):
            raise DataError("zephon unit table has trailing bytes")
        return cls(**columns)


class UnitTableBuilder:
    """Appends units one by one into compact arrays (8 bytes or less a value while planning,
    not a Python object a unit)."""

    def __init__(self) -> None:
        self._columns = {name: array("q") for name, _ in _COLUMNS}

    def add(self, file_index: int, spec: UnitSpec) -> None:
        code = _CODES.get(spec.kind)
        if code is None:
            raise ValueError(f"unknown unit kind {spec.kind!r}")
        columns = self._columns
        columns["file"].append(file_index)
        columns["kind"].append(code)
        columns["group"].append(spec.group)
        columns["start"].append(spec.start)
        columns["stop"].append(spec.stop)

    def __len__(self) -> int:
        return len(self._columns["file"])

    def table(self) -> UnitTable:
        return UnitTable(**{name: np.frombuffer(self._columns[name], dtype=np.int64).astype(kind)
                            for name, kind in _COLUMNS})
