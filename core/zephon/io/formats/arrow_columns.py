"""Arrow columns as a unit's rows, shared by the Parquet and Arrow IPC readers: the memory
pool they read into, the checks that make a damaged file a DataError naming it, and the
columns as Python values (lists of token ids as numpy views, not a Python int per id)."""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import pyarrow as pa

from zephon.errors import DataError


@functools.cache
def read_memory_pool() -> pa.MemoryPool:
    """The Arrow memory pool data units are read into: jemalloc where pyarrow has it, else the
    C allocator; Arrow's default when ``ARROW_DEFAULT_MEMORY_POOL`` chooses it.

    Arrow's default pool on Linux, mimalloc, backs its memory with transparent huge pages where
    the system grants them on request (THP ``madvise`` mode, a common default) and keeps
    faulting new ones in as it frees and reuses memory: most in a process's first reads of 2 MiB
    row groups, and still some every few reads after. A huge-page fault zeroes 2 MiB
    and, on a host whose memory is fragmented, waits for the kernel to compact it. Read as a
    lane reads them, one row group at a time between tokenizer calls
    (``benchmarks/parquet_reads.py``), with mimalloc the slowest read took many times as long
    and the reads more CPU, varying from run to run; with jemalloc, which Arrow configures
    without huge pages, both were low in every run. Inside the pipeline such a stall delayed
    the first batch (measured: docs/measurements.md)."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


def arrow_kind(kind: pa.DataType) -> str:
    """A column type as ``zephon check`` names it: ``"text"``, ``"list<int>"``, ``"list"``, or
    Arrow's name for another type."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return "list<int>" if pa.types.is_integer(kind.value_type) else "list"
    return str(kind)


def check_columns(available: list[str], wanted: list[str], display: str) -> None:
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DataError(
            f"{display}: missing field {missing[0]!r}; the file has fields {sorted(available)}")
    doubled = [c for c in wanted if available.count(c) > 1]
    if doubled:
        raise DataError(f"{display}: field {doubled[0]!r} appears {available.count(doubled[0])} "
                        "times in the file's schema; a damaged or ambiguous file")


def check_arrow(table: pa.Table, columns: list[str] | None, first_row: int,
                 display: str) -> None:
    """Check the rows of ``table`` (a slice of a memory-mapped Arrow file whose first row is
    row ``first_row`` of the file) before any value is read from ``columns`` (None: all).

    Per record batch, in two steps. (1) No buffer of a requested column may share a byte with
    another buffer of the batch: a damaged buffer position in the batch's metadata would
    otherwise read another column's bytes, offsets and text all valid. One ``buffers()`` call
    per column and a sort of the buffers per batch; it needs the buffers to be views of the
    file, which they are unless the file is compressed (then they are decompressed into fresh
    memory and a redirected buffer decompresses another column: not detected). (2)
    ``validate(full=True)`` of each requested column's rows: offsets inside their buffers and
    rising, UTF-8 text, null counts. Both together add to a unit's read a cost that is
    negligible beside tokenizing the unit (measured: docs/measurements.md); cheaper
    offset-only checks would leave the UTF-8 errors to Python's decoder and the nested types
    unchecked.
    """
    names = table.column_names
    wanted = set(names if columns is None else columns)
    row = first_row
    for chunks in zip(*(column.chunks for column in table.columns), strict=True):
        rows = len(chunks[0]) if chunks else 0
        _check_disjoint(names, chunks, wanted, f"{display}: rows {row}..{row + rows}")
        for name, chunk in zip(names, chunks, strict=True):
            if name in wanted:
                try:
                    chunk.validate(full=True)
                except pa.ArrowException as exc:
                    where = _bad_rows(pa.chunked_array([chunk]), row)
                    raise DataError(f"{display}: {where}: column {name!r} is damaged "
                                    f"({exc})") from None
        row += rows


def _check_disjoint(names: list[str], chunks: tuple[pa.Array, ...], wanted: set[str],
                    where: str) -> None:
    """Raise when a buffer of a ``wanted`` column overlaps another buffer of the same batch.

    Sorted by start, a buffer overlaps an earlier one exactly when it starts before the
    furthest end seen so far, and then it overlaps the buffer that reaches that end."""
    spans = sorted((b.address, b.address + b.size, name)
                   for name, chunk in zip(names, chunks, strict=True)
                   for b in chunk.buffers() if b is not None and b.size)
    reach, owner = 0, ""
    for start, end, name in spans:
        if start < reach and (name in wanted or owner in wanted):
            read, other = (name, owner) if name in wanted else (owner, name)
            raise DataError(f"{where}: column {read!r} shares bytes with column {other!r}; "
                            "the file is damaged")
        if end > reach:
            reach, owner = end, name


def check_text(table: pa.Table, first_row: int, display: str) -> None:
    """Raise a DataError naming the row when a string of ``table`` (rows from ``first_row`` of
    the file) is not valid UTF-8, which Parquet decoding does not check. Only columns holding
    strings (nested ones included) are validated, in full; other columns are skipped. It costs
    a small share of reading a row group (measured: docs/measurements.md): Parquet units are
    checked only once making their strings has failed (that decoding checks UTF-8 too), to
    name the row."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not _has_text(column.type):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowException as exc:
            raise DataError(f"{display}: {_bad_rows(column, first_row)}: column {name!r} is "
                            f"damaged ({exc})") from None


def _has_text(kind: pa.DataType) -> bool:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            getattr(pa.types, "is_string_view", lambda _: False)(kind):
        return True
    if pa.types.is_dictionary(kind):
        return _has_text(kind.value_type)
    return any(_has_text(kind.field(i).type) for i in range(kind.num_fields))


def _bad_rows(column: pa.ChunkedArray, first_row: int) -> str:
    """``row n``: the first row of a string ``column`` that fails full validation, found on
    the error path by a binary search (each step validates a half again); ``rows a..b`` for a
    nested column, whose row slices share one child array and cannot be told apart."""
    low, high = 0, len(column)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return f"rows {first_row}..{first_row + high}"
    while high - low > 1:
        middle = (low + high) // 2
        try:
            column.slice(low, middle - low).validate(full=True)
            low = middle
        except pa.ArrowException:
            high = middle
    return f"row {first_row + low}"


def table_columns(table: pa.Table, columns: list[str] | None,
                   display: str) -> dict[str, Any]:
    names = table.column_names
    if columns is not None:
        check_columns(names, columns, display)
    twice = sorted({name for name in (columns or names) if names.count(name) > 1})
    if twice:
        raise DataError(f"{display}: column(s) {twice} appear more than once in the file's "
                        f"schema ({names}); a row cannot say which one holds the data. "
                        "Rewrite the file with unique column names, or leave it out")
    return {name: _column_values(table.column(name)) for name in (columns or names)}


def _column_values(column: pa.ChunkedArray) -> Any:
    """A column's values by row: Python objects, except lists of integers (token ids), which
    stay one numpy buffer read by row without a Python object per id."""
    kind = column.type
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and \
            pa.types.is_integer(kind.value_type):
        return ListColumn(column.combine_chunks(read_memory_pool()) if column.num_chunks != 1 else
                          column.chunk(0))
    return column.to_pylist()


class ListColumn:
    """An Arrow list<int> column read by row: ``column[r]`` is a numpy view of row ``r``'s
    values (None for a null row)."""

    def __init__(self, array: pa.Array):
        # ``values`` is the whole backing buffer and ``offsets`` index it, slices included.
        self._values = array.values.to_numpy(zero_copy_only=False)
        self._offsets = array.offsets.to_numpy(zero_copy_only=False)
        self._valid = None if array.null_count == 0 else \
            array.is_valid().to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, r: int) -> np.ndarray | None:
        if self._valid is not None and not self._valid[r]:
            return None
        return self._values[self._offsets[r]:self._offsets[r + 1]]
