"""Arrow IPC files (file or stream format), memory-mapped: a unit is a row range. Offsets and
lengths come from the file, so the requested columns of a unit's rows are validated in full
before they are read, and their buffers must not share bytes with another column's."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from zephon.io.formats.arrow_columns import (
    arrow_kind,
    check_arrow,
    check_columns,
    table_columns,
)
from zephon.io.units import PlanHints, UnitSpec, row_units

SUFFIXES = {".arrow": None, ".feather": None, ".ipc": None}


def plan(path: str, compression: str | None, hints: PlanHints, min_units: int,
         rows: tuple[int, int] | None = None) -> list[UnitSpec]:
    """Row ranges of ``hints.arrow_unit_rows`` rows at most."""
    return row_units(0, open_arrow(path).num_rows, hints.arrow_unit_rows, min_units)


def fields(path: str, compression: str | None) -> dict[str, str]:
    """The file's fields and their kinds, from its schema."""
    try:
        schema = pa.ipc.open_file(pa.memory_map(path, "r")).schema
    except pa.ArrowInvalid:
        schema = pa.ipc.open_stream(pa.memory_map(path, "r")).schema
    return {f.name: arrow_kind(f.type) for f in schema}


def read(path: str, compression: str | None, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, Any], list[int]]:
    """A unit's rows, checked; a row's key is its row number in the file."""
    table = open_arrow(path).slice(unit.start, unit.stop - unit.start)
    if columns is not None:
        check_columns(table.column_names, columns, display)
    check_arrow(table, columns, unit.start, display)
    if columns is not None:
        table = table.select(columns)
    keys = list(range(unit.start, unit.start + table.num_rows))
    return table_columns(table, columns, display), keys


def open_arrow(path: str) -> pa.Table:
    source = pa.memory_map(path, "r")
    try:
        return pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        source = pa.memory_map(path, "r")
        return pa.ipc.open_stream(source).read_all()
