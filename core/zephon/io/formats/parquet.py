"""Parquet files: a unit is a row group (or a row range of one, when a dataset has too few
groups for its lanes). Only the requested columns are read, into
:func:`~zephon.io.formats.arrow_columns.read_memory_pool`; string columns are validated,
since Parquet decoding does not check UTF-8."""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.io.formats.arrow_columns import (
    arrow_kind,
    check_columns,
    check_text,
    read_memory_pool,
    table_columns,
)
from zephon.io.units import PlanHints, UnitSpec

SUFFIXES = {".parquet": None}


def plan(path: str, compression: str | None, hints: PlanHints, min_units: int,
         rows: tuple[int, int] | None = None) -> list[UnitSpec]:
    """The file's units, from its footer."""
    meta = pq.ParquetFile(path).metadata
    return parquet_units([meta.row_group(i).num_rows for i in range(meta.num_row_groups)],
                         min_units)


def fields(path: str, compression: str | None) -> dict[str, str]:
    """The file's fields and their kinds, from its schema."""
    return {f.name: arrow_kind(f.type) for f in pq.read_schema(path)}


def read(path: str, compression: str | None, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, Any], list[int]]:
    """A unit's rows; a row's key is its row number in the file."""
    table, base = _read_row_group(path, unit.group, columns, display)
    table = table.slice(unit.start, unit.stop - unit.start)
    keys = list(range(base + unit.start, base + unit.start + table.num_rows))
    try:
        return table_columns(table, columns, display), keys
    except UnicodeDecodeError:  # Parquet decoding does not check UTF-8; making str does
        check_text(table, base + unit.start, display)  # names the row
        raise


def parquet_units(groups: Sequence[int], min_units: int) -> list[UnitSpec]:
    """The units of a Parquet file whose row groups hold ``groups`` rows: one a row group,
    or row ranges of them when that gives fewer than ``min_units``."""
    units = [UnitSpec("row_group", g, 0, n) for g, n in enumerate(groups) if n > 0]
    if len(units) >= min_units or not units:
        return units
    per_unit = max(1, math.ceil(sum(groups) / min_units))
    return [UnitSpec("row_group", g, s, min(s + per_unit, n))
            for g, n in enumerate(groups) for s in range(0, n, per_unit)]


def row_groups_from_tail(tail: bytes) -> tuple[int, ...] | None:
    """The rows of each row group of a Parquet file, from its last bytes when they hold the
    whole footer (quicker than ``pq.read_metadata``; measured: docs/measurements.md); None
    when they do not, or are not a Parquet footer."""
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        return None
    if int.from_bytes(tail[-8:-4], "little") + 8 > len(tail):
        return None
    try:
        reader = pq.ParquetReader()
        reader.open(pa.BufferReader(tail))
        meta = reader.metadata
    except (pa.ArrowException, OSError):
        return None
    count = meta.num_row_groups
    if count == 1:
        return (meta.num_rows,)
    return tuple(meta.row_group(i).num_rows for i in range(count))


@functools.lru_cache(maxsize=256)
def _footer(path: str, mtime_ns: int, size: int) -> pq.FileMetaData:
    return pq.read_metadata(path)


def _read_row_group(path: str, group: int, columns: list[str] | None,
                    display: str) -> tuple[pa.Table, int]:
    """One row group's ``columns`` (all when None), read into :func:`read_memory_pool`, and
    the number of rows before it in the file. The footer is parsed once per file version;
    no handle is kept open, so a shard cache can delete a file once it is read.

    Files are local (remote ones come through the shard cache), so reads are not pre-buffered:
    pre-buffering coalesces reads on a background I/O pool for object stores, and on a local
    file only adds that pool's work (a unit read takes less CPU without it; measured:
    docs/measurements.md)."""
    stat = os.stat(path)
    footer = _footer(path, stat.st_mtime_ns, stat.st_size)
    reader = pq.ParquetReader(memory_pool=read_memory_pool())
    _open_parquet(reader, path, footer)
    try:
        indices = None
        if columns is not None:
            check_columns(reader.schema_arrow.names, columns, display)
            wanted = set(columns)  # a nested field is read through all its leaf columns
            indices = [i for i, leaf in enumerate(reader.column_paths) if leaf[0] in wanted]
        table = reader.read_row_group(group, column_indices=indices, use_threads=False)
    finally:
        reader.close()
    return table, sum(footer.row_group(g).num_rows for g in range(group))


def _open_parquet(reader: Any, path: str, footer: pq.FileMetaData) -> None:
    """Open as ``pq.ParquetFile`` does: Parquet's UUID and JSON columns become Arrow extension
    types (UUID objects, JSON text) also in files written without an Arrow schema, where this
    pyarrow has the option."""
    extensions = {"arrow_extensions_enabled": True} if _PARQUET_EXTENSIONS else {}
    reader.open(path, metadata=footer, pre_buffer=False, **extensions)


_PARQUET_EXTENSIONS = "arrow_extensions_enabled" in inspect.signature(
    pq.ParquetFile.__init__).parameters
"""Whether this pyarrow reads Parquet logical types as Arrow extension types on request."""
