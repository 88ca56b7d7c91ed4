"""File formats: planning work units inside a file and reading them.

A *unit* is the smallest piece of a file that is read on its own: a Parquet row group (split
into row ranges only when a dataset has too few groups for its lanes), a byte range of an
uncompressed JSONL file (a unit owns the lines that *start* inside its range, so ranges need no
alignment), a row range of an Arrow IPC file, or a whole compressed JSONL file (gzip and zstd
streams cannot be entered in the middle).

Readers return the requested columns as Python lists. Only the projected columns are read from
Parquet and Arrow; JSONL lines are parsed one by one so an error can name its line.

What is read is checked before it is trusted, so a damaged file is a :class:`DataError` naming
it, never a crash or a value made of bytes that belong elsewhere. Arrow IPC data is memory-mapped
and its offsets and lengths come from the file: the requested columns of the unit's rows are
validated in full (offsets inside their buffers and rising, UTF-8 text) and their buffers must
not share bytes with another column's. Parquet decoding builds offsets itself, but not UTF-8
checks: string columns are validated. JSONL text is checked by the JSON parser.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DataError
from zephon.io.file_formats import (
    BUILT_IN,
    context_keyword,
    detect_plugin,
    known_formats,
    plugin,
)
from zephon.io.indexed import DocumentColumn, open_indexed
from zephon.io.units import PlanHints, UnitSpec, row_units

FORMATS = BUILT_IN
"""The formats read here; :func:`~zephon.io.file_formats.known_formats` adds the plug-ins."""
TOKENS_FIELD = "input_ids"
"""The one column a Megatron indexed dataset has: each document's token ids."""

_SUFFIXES: dict[str, tuple[str, str | None]] = {
    ".parquet": ("parquet", None),
    ".jsonl": ("jsonl", None),
    ".json": ("jsonl", None),
    ".ndjson": ("jsonl", None),
    ".jsonl.gz": ("jsonl", "gzip"),
    ".json.gz": ("jsonl", "gzip"),
    ".jsonl.zst": ("jsonl", "zstd"),
    ".json.zst": ("jsonl", "zstd"),
    ".arrow": ("arrow", None),
    ".feather": ("arrow", None),
    ".ipc": ("arrow", None),
    ".idx": ("megatron", None),
}


_READ_ERRORS = (OSError, pa.ArrowException, UnicodeDecodeError)
"""What pyarrow raises for an unreadable file; UnicodeDecodeError when a field name in damaged
metadata is not UTF-8 (values are validated before they are decoded)."""


def detect_format(name: str) -> tuple[str, str | None] | None:
    """(format, compression) from a file name, or None when the suffix is not a data file;
    a registered format's suffixes (:mod:`zephon.io.file_formats`) come first."""
    registered = detect_plugin(name)
    if registered is not None:
        return registered, None
    lower = name.lower()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix):
            return _SUFFIXES[suffix]
    return None


def compression_of(name: str) -> str | None:
    lower = name.lower()
    if lower.endswith(".gz"):
        return "gzip"
    if lower.endswith(".zst"):
        return "zstd"
    return None


def plan_file(path: str, fmt: str, compression: str | None, hints: PlanHints,
              min_units: int = 1, rows: tuple[int, int] | None = None,
              context: str | None = None) -> list[UnitSpec]:
    """Split one file into units; ``min_units`` asks for at least that many when possible.
    ``rows`` limits a Megatron indexed dataset to a range of its documents; ``context`` is
    the file's :attr:`~zephon.io.dataset.DataFile.context`."""
    registered = plugin(fmt)
    if registered is not None:
        extra = context_keyword(registered, context)
        return _plugin_call(lambda: registered.plan(path, hints, min_units, **extra), fmt,
                            path)
    try:
        if fmt == "megatron":
            count = open_indexed(path).documents
            start, stop = rows if rows is not None else (0, count)
            if not 0 <= start <= stop <= count:
                raise DataError(f"{path}: documents {start}..{stop} are outside its "
                                f"{count} documents")
            return row_units(start, stop, hints.arrow_unit_rows, min_units)
        if fmt == "parquet":
            return _plan_parquet(path, min_units)
        if fmt == "arrow":
            return _plan_arrow(path, hints.arrow_unit_rows, min_units)
        if fmt == "jsonl":
            if compression is not None:
                return [UnitSpec("file", 0, 0, -1)]
            return byte_units(Path(path).stat().st_size, hints.unit_bytes, min_units)
    except DataError:
        raise
    except _READ_ERRORS as exc:
        raise DataError(f"cannot read {fmt} file {path}: {exc}") from exc
    raise DataError(f"unknown format {fmt!r} for {path}; known formats: "
                    f"{', '.join(known_formats())}")


def _plugin_call(call: Any, fmt: str, display: str) -> Any:
    """``call()`` of a format plug-in, its read errors named as the built-in formats' are."""
    try:
        return call()
    except DataError:
        raise
    except _READ_ERRORS as exc:
        raise DataError(f"cannot read {fmt} file {display}: {exc}") from exc


def byte_units(size: int, unit_bytes: int, min_units: int) -> list[UnitSpec]:
    """The units of an uncompressed JSON Lines file of ``size`` bytes: byte ranges of about
    ``unit_bytes`` (at least ``min_units`` of them while each holds a byte); a reader starts
    at the first line that begins inside its range."""
    if size == 0:
        return []
    n = min(max(math.ceil(size / unit_bytes), min_units), size)
    step = math.ceil(size / n)
    return [UnitSpec("bytes", 0, s, min(s + step, size)) for s in range(0, size, step)]


def _plan_parquet(path: str, min_units: int) -> list[UnitSpec]:
    meta = pq.ParquetFile(path).metadata
    return parquet_units([meta.row_group(i).num_rows for i in range(meta.num_row_groups)],
                         min_units)


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
    whole footer (15 us with one row group, where ``pq.read_metadata`` takes 26 us); None
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


def _open_arrow(path: str) -> pa.Table:
    source = pa.memory_map(path, "r")
    try:
        return pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        source = pa.memory_map(path, "r")
        return pa.ipc.open_stream(source).read_all()


def _plan_arrow(path: str, unit_rows: int, min_units: int) -> list[UnitSpec]:
    return row_units(0, _open_arrow(path).num_rows, unit_rows, min_units)


def read_unit(path: str, fmt: str, compression: str | None, unit: UnitSpec,
              columns: list[str] | None, display: str,
              context: str | None = None) -> tuple[dict[str, list[Any]], list[int]]:
    """Read one unit's rows, column-wise, and a stable key per row.

    ``columns=None`` reads every column. Keys identify a row inside its file: the row number
    (Parquet, Arrow, compressed JSONL: the line number) or the byte offset of the line
    (uncompressed JSONL). ``display`` names the file in error messages; ``context`` is the
    file's :attr:`~zephon.io.dataset.DataFile.context`.
    """
    registered = plugin(fmt)
    if registered is not None:
        extra = context_keyword(registered, context)
        return _plugin_call(lambda: registered.read(path, unit, columns, display, **extra),
                            fmt, display)
    try:
        if fmt == "parquet":
            table, base = _read_row_group(path, unit.group, columns, display)
            table = table.slice(unit.start, unit.stop - unit.start)
            _check_text(table, base + unit.start, display)
            keys = list(range(base + unit.start, base + unit.start + table.num_rows))
            return _table_columns(table, columns, display), keys
        if fmt == "arrow":
            table = _open_arrow(path).slice(unit.start, unit.stop - unit.start)
            if columns is not None:
                _check_columns(table.column_names, columns, display)
            _check_arrow(table, columns, unit.start, display)
            if columns is not None:
                table = table.select(columns)
            keys = list(range(unit.start, unit.start + table.num_rows))
            return _table_columns(table, columns, display), keys
        if fmt == "jsonl":
            return _read_jsonl(path, compression, unit, columns, display)
        if fmt == "megatron":
            if columns is not None:
                _check_columns([TOKENS_FIELD], columns, display)
            column = DocumentColumn(open_indexed(path), unit.start, unit.stop)
            return {TOKENS_FIELD: column}, list(range(unit.start, unit.stop))
    except DataError:
        raise
    except _READ_ERRORS as exc:
        raise DataError(f"cannot read {fmt} file {display}: {exc}") from exc
    raise DataError(f"unknown format {fmt!r} for {display}")


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
    file only adds that pool's work (a unit of 256 texts of 7 KB read in about 10% less CPU
    without it)."""
    stat = os.stat(path)
    footer = _footer(path, stat.st_mtime_ns, stat.st_size)
    reader = pq.ParquetReader(memory_pool=read_memory_pool())
    _open_parquet(reader, path, footer)
    try:
        indices = None
        if columns is not None:
            _check_columns(reader.schema_arrow.names, columns, display)
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


@functools.cache
def read_memory_pool() -> pa.MemoryPool:
    """The Arrow memory pool data units are read into: jemalloc where pyarrow has it, else the
    C allocator; Arrow's default when ``ARROW_DEFAULT_MEMORY_POOL`` chooses it.

    Arrow's default pool on Linux, mimalloc, backs its memory with transparent huge pages where
    the system grants them on request (THP ``madvise`` mode, a common default) and keeps
    faulting new ones in as it frees and reuses memory: 17-24 in a process's first 40 reads of
    2 MiB row groups, 5-9 in each 40 after. A huge-page fault zeroes 2 MiB and, on a host
    whose memory is fragmented, waits for the kernel to compact it. Measured with
    ``benchmarks/parquet_reads.py`` (40 row groups of 256 texts of 7 KB, 50 ms apart, as a lane
    reads them between tokenizer calls): with mimalloc the slowest read took 62-200 ms and all
    40 reads 0.25-0.54 s of CPU in most runs; with jemalloc, which Arrow configures without
    huge pages, 7-9 ms and 0.20-0.23 s, every run. Inside the pipeline such a stall delayed
    the first batch to 0.21 s instead of 0.06 s."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


def _check_columns(available: list[str], wanted: list[str], display: str) -> None:
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DataError(
            f"{display}: missing field {missing[0]!r}; the file has fields {sorted(available)}")
    doubled = [c for c in wanted if available.count(c) > 1]
    if doubled:
        raise DataError(f"{display}: field {doubled[0]!r} appears {available.count(doubled[0])} "
                        "times in the file's schema; a damaged or ambiguous file")


def _check_arrow(table: pa.Table, columns: list[str] | None, first_row: int,
                 display: str) -> None:
    """Check the rows of ``table`` (a slice of a memory-mapped Arrow file whose first row is
    row ``first_row`` of the file) before any value is read from ``columns`` (None: all).

    Per record batch, in two steps. (1) No buffer of a requested column may share a byte with
    another buffer of the batch: a damaged buffer position in the batch's metadata would
    otherwise read another column's bytes, offsets and text all valid. One ``buffers()`` call
    per column and a sort of the buffers (about 1 µs per column) per batch; it needs the
    buffers to be views of the file, which they are unless the file is compressed (then they
    are decompressed into fresh memory and a redirected buffer decompresses another column:
    not detected). (2) ``validate(full=True)`` of each requested column's rows: offsets inside
    their buffers and rising, UTF-8 text, null counts. Both together cost about 0.12 ms for a
    unit of 256 texts of 7 KB (its read goes from 0.27 to 0.40 ms, against about 0.25 s to
    tokenize it at 1.7M tokens/s); cheaper offset-only checks would leave the UTF-8 errors to
    Python's decoder and the nested types unchecked.
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


def _check_text(table: pa.Table, first_row: int, display: str) -> None:
    """Raise a DataError naming the row when a string of ``table`` (rows from ``first_row`` of
    the file) is not valid UTF-8, which Parquet decoding does not check. Only columns holding
    strings (nested ones included) are validated, in full; other columns are skipped. About
    0.09 ms for a row group of 256 texts of 7 KB, 3% of reading it (2.9 ms)."""
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


def _table_columns(table: pa.Table, columns: list[str] | None,
                   display: str) -> dict[str, Any]:
    names = table.column_names
    if columns is not None:
        _check_columns(names, columns, display)
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


def _jsonl_lines(path: str, compression: str | None, unit: UnitSpec):
    """Yield (line_number_or_None, byte_offset, raw_line) for the lines the unit owns."""
    if unit.kind == "file":
        stream = pa.input_stream(path, compression=compression)
        buffered = _LineReader(stream)
        for number, line in enumerate(buffered, start=1):
            yield number, None, line
        return
    with open(path, "rb") as fh:
        offset = unit.start
        if offset > 0:
            fh.seek(offset - 1)
            skipped = fh.readline()  # finishes the line that began before this unit
            offset += len(skipped) - 1
        while offset < unit.stop:
            line = fh.readline()
            if not line:
                break
            yield None, offset, line
            offset += len(line)


class _LineReader:
    """Lines of a pyarrow input stream (handles gzip/zstd transparently)."""

    def __init__(self, stream: pa.NativeFile, chunk: int = 1 << 20):
        self._stream = stream
        self._chunk = chunk

    def __iter__(self):
        rest = b""
        with self._stream as stream:
            while True:
                data = stream.read(self._chunk)
                if not data:
                    break
                data = rest + data
                lines = data.split(b"\n")
                rest = lines.pop()
                for line in lines:
                    yield line + b"\n"
        if rest:
            yield rest


class RowLabel:
    """Names one row of a file in messages: ``file:line`` for JSON Lines (from a byte offset
    the line is counted only when a message is made, so labelling every row costs nothing),
    ``file: row n`` for Parquet and Arrow."""

    __slots__ = ("display", "key", "kind", "path")

    def __init__(self, display: str, path: str, fmt: str, compression: str | None, key: int):
        self.display, self.path, self.key = display, path, key
        registered = plugin(fmt)
        self.kind = (registered.row_label if registered is not None else "row"
                     if fmt != "jsonl" else "line" if compression else "offset")

    def __str__(self) -> str:
        if self.kind == "offset":
            try:
                return f"{self.display}:{_line_number(self.path, self.key)}"
            except OSError:  # the file went away (an evicted shard): say where in bytes
                return f"{self.display}: byte {self.key}"
        if self.kind == "line":
            return f"{self.display}:{self.key}"
        return f"{self.display}: {self.kind} {self.key}"

    __repr__ = __str__


def _line_number(path: str, offset: int) -> int:
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def _json_hint(path: str, raw: bytes | str) -> str:
    """For a ``.json`` file whose line is not a JSON document: it is read as JSON Lines."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if not path.endswith((".json", ".json.gz", ".json.zst")):
        return ""
    stripped = text.strip()
    pretty = stripped in ("]", "}", "},", "],") or stripped.endswith((",", "{", "["))
    shape = " (it looks like a pretty-printed JSON document or array)" if pretty else ""
    return (f"; .json files are read as JSON Lines, one object per line{shape}: rewrite it "
            "with one object per line (for example jq -c '.[]' FILE > FILE.jsonl)")


def _read_jsonl(path: str, compression: str | None, unit: UnitSpec, columns: list[str] | None,
                display: str) -> tuple[dict[str, list[Any]], list[int]]:
    rows: list[dict[str, Any]] = []
    keys: list[int] = []
    for number, offset, raw in _jsonl_lines(path, compression, unit):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            line = number if number is not None else _line_number(path, offset)
            hint = _json_hint(path, raw)
            raise DataError(f"{display}:{line}: malformed JSON line ({exc}){hint}") from None
        except RecursionError:
            line = number if number is not None else _line_number(path, offset)
            raise DataError(f"{display}:{line}: the JSON on this line nests deeper than Python "
                            f"can parse (limit {sys.getrecursionlimit()} levels); flatten it or "
                            "leave the file out") from None
        if not isinstance(value, dict):
            line = number if number is not None else _line_number(path, offset)
            raise DataError(f"{display}:{line}: expected a JSON object, got "
                            f"{type(value).__name__}")
        if columns is not None:
            for name in columns:
                if name not in value:
                    line = number if number is not None else _line_number(path, offset)
                    raise DataError(f"{display}:{line}: missing field {name!r}; the line has "
                                    f"fields {sorted(value)}")
        rows.append(value)
        keys.append(number if number is not None else offset)
    if columns is None:
        names: list[str] = []
        for row in rows:
            for key in row:
                if key not in names:
                    names.append(key)
        columns = names
    return {name: [row.get(name) for row in rows] for name in columns}, keys
