"""``PlannedDataset``: one dataset of a :class:`StaticMixtureWorkSource` as the engine reads it.

It implements :class:`zephon.work.protocol.DatasetWork` over the work source's plan for one
lane count: which unit a lane reads k-th and in which row order (the work source's seeded
orders), and each unit's rows read from its file (local, object store or the Hub, whose
caches stay behind :meth:`~zephon.io.Dataset.local_file`). A remote dataset downloads the
files of a lane's next units in the background when :meth:`fetch_ahead` is asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.io.formats import RowLabel, read_unit
from zephon.work.protocol import LaneUnit, UnitRows

if TYPE_CHECKING:
    from zephon.work.static_mixture import StaticMixtureWorkSource

ROW_COUNTED = ("rows", "row_group")
"""Unit kinds whose row count the plan knows before reading."""


class PlannedDataset:
    """Dataset ``index`` of ``source`` planned for ``lanes`` lanes; see the module
    docstring."""

    def __init__(self, source: StaticMixtureWorkSource, index: int, lanes: int):
        self.source, self.index, self.lanes = source, index, lanes
        self.dataset = source.datasets[index]
        self.name: str = self.dataset.name
        self.repeated: bool = source.repeated[index]
        self._units = source.plan(lanes)[index]

    def unit_count(self) -> int:
        return len(self._units)

    def unit_at(self, lane: int, k: int) -> LaneUnit | None:
        found = self.source.unit_at(self.index, lane, k, self.lanes)
        if found is None:
            return None
        epoch, index, (file_index, spec) = found
        rows = spec.stop - spec.start if spec.kind in ROW_COUNTED else None
        return LaneUnit(epoch, index, file_index, rows)

    def units_of_lane(self, lane: int) -> int | None:
        return self.source.units_of_lane(self.index, lane, self.lanes)

    def lane_units(self, lane: int) -> list[int]:
        return self.source.lane_units(self.index, lane, self.lanes)

    def row_order(self, unit: LaneUnit, n: int) -> np.ndarray:
        return self.source.row_order(self.index, unit.epoch, unit.index, n)

    def read(self, index: int, columns: Sequence[str] | None) -> UnitRows:
        file_index, spec = self._units[index]
        data_file = self.dataset.files()[file_index]
        display = self.dataset.display_name(data_file)
        with self.dataset.local_file(data_file) as local:
            table, keys = read_unit(local, data_file.fmt, data_file.compression, spec,
                                    list(columns) if columns is not None else None, display,
                                    data_file.context)
        return UnitRows(table, keys, RowLabel.labeller(display, local, data_file.fmt,
                                                       data_file.compression), file_index)

    def reads_off_gil(self, index: int) -> bool:
        """Whether reading unit ``index`` is mostly native code that releases the GIL (Parquet
        and Arrow decoding), so that the engine may read it ahead on a thread of its own
        (:mod:`zephon.engine.unit_reads`); JSON Lines are parsed in Python."""
        file_index, _ = self._units[index]
        return self.dataset.files()[file_index].fmt in ("parquet", "arrow")

    def fetch_ahead(self, units: Sequence[LaneUnit]) -> None:
        fetch = getattr(self.dataset, "fetch_ahead", None)
        if fetch is None:  # local data: nothing to fetch
            return
        files = self.dataset.files()
        wanted: list[Any] = []
        for unit in units:
            if files[unit.container] not in wanted:
                wanted.append(files[unit.container])
        if wanted:
            fetch(wanted)

    def digest(self) -> str:
        return self._units.digest()

    def skipped_files(self) -> list[Any]:
        return self.dataset.skipped_files()
