"""File formats: planning work units inside a file and reading them, one module a format.

A *unit* is the smallest piece of a file that is read on its own: a Parquet row group
(:mod:`.parquet`; split into row ranges only when a dataset has too few groups for its lanes),
a byte range of an uncompressed JSON Lines file or a whole compressed one (:mod:`.jsonl`), a
row range of an Arrow IPC file (:mod:`.arrow`), or a range of documents of a Megatron indexed
dataset (:mod:`.megatron`). Each built-in module has its ``SUFFIXES``, ``plan`` and ``read``;
this module detects a file's format and sends it to its module. Plug-in formats
(:mod:`zephon.io.formats.registry`) come first: MDS (:mod:`.mds`) and LitData (:mod:`.litdata`)
ship with zephon, others are one module and one ``register_format`` call.

Readers return the requested columns by row. Only the projected columns are read from Parquet
and Arrow; JSON Lines are parsed line by line so an error can name its line.

What is read is checked before it is trusted, so a damaged file is a :class:`DataError` naming
it, never a crash or a value made of bytes that belong elsewhere
(:mod:`.arrow_columns`: Arrow IPC offsets and buffers validated in full, Parquet strings
checked for UTF-8; JSON Lines text is checked by the JSON parser).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from zephon.errors import DataError
from zephon.io.formats import arrow, jsonl, megatron, parquet
from zephon.io.formats.arrow_columns import ListColumn, read_memory_pool
from zephon.io.formats.file_format import FieldKinds, FileFormat
from zephon.io.formats.jsonl import byte_units, line_number
from zephon.io.formats.megatron import TOKENS_FIELD
from zephon.io.formats.parquet import parquet_units, row_groups_from_tail
from zephon.io.formats.registry import (
    BUILT_IN,
    context_keyword,
    detect_plugin,
    known_formats,
    plugin,
    register_format,
    unregister_format,
)
from zephon.io.units import PlanHints, UnitSpec, row_units

__all__ = [
    "FORMATS",
    "TOKENS_FIELD",
    "FieldKinds",
    "FileFormat",
    "ListColumn",
    "PlanHints",
    "RowLabel",
    "UnitSpec",
    "byte_units",
    "compression_of",
    "detect_format",
    "file_fields",
    "known_formats",
    "parquet_units",
    "plan_file",
    "plan_listed",
    "read_memory_pool",
    "read_unit",
    "register_format",
    "row_groups_from_tail",
    "row_units",
    "unregister_format",
]

FORMATS = BUILT_IN
"""The formats read here; :func:`~zephon.io.formats.registry.known_formats` adds the plug-ins."""
_MODULES: dict[str, Any] = {"parquet": parquet, "jsonl": jsonl, "arrow": arrow,
                            "megatron": megatron}
"""The module of each built-in format."""
_SUFFIXES: dict[str, tuple[str, str | None]] = {
    suffix: (name, compression) for name, module in _MODULES.items()
    for suffix, compression in module.SUFFIXES.items()}
_LONGEST_FIRST = sorted(_SUFFIXES, key=len, reverse=True)

_READ_ERRORS = (OSError, pa.ArrowException, UnicodeDecodeError)
"""What pyarrow raises for an unreadable file; UnicodeDecodeError when a field name in damaged
metadata is not UTF-8 (values are validated before they are decoded)."""


def detect_format(name: str) -> tuple[str, str | None] | None:
    """(format, compression) from a file name, or None when the suffix is not a data file;
    a registered format's suffixes (:mod:`zephon.io.formats.registry`) come first."""
    registered = detect_plugin(name)
    if registered is not None:
        return registered, None
    lower = name.lower()
    for suffix in _LONGEST_FIRST:
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
    reader = _reader(fmt, path, context)
    return _named_errors(lambda: reader.plan(path, compression, hints, min_units, rows), fmt,
                         path)


def plan_listed(data_file: Any, hints: PlanHints, min_units: int,
                local_file: Callable[[Any], AbstractContextManager[str]],
                row_groups: Sequence[int] | None = None) -> list[UnitSpec]:
    """The units of a remote file (a :class:`~zephon.io.dataset.DataFile`) from what its
    listing knows, downloading nothing where it can: Parquet row groups (``row_groups``, else
    the listing's), byte ranges of a plain JSON Lines file from its size, a compressed one
    whole, a plug-in's units from its index (``context``); any other file is planned from the
    local copy ``local_file(data_file)`` gives."""
    groups = row_groups if row_groups is not None else data_file.row_groups
    if data_file.fmt == "parquet" and groups is not None:
        return parquet_units(groups, min_units)
    if data_file.fmt == "jsonl" and data_file.compression is None:
        return byte_units(data_file.size, hints.unit_bytes, min_units)
    if data_file.fmt == "jsonl":
        return [UnitSpec("file", 0, 0, -1)]
    if data_file.context is not None:
        return plan_file(data_file.path, data_file.fmt, data_file.compression, hints,
                         min_units, context=data_file.context)
    with local_file(data_file) as local:
        return plan_file(local, data_file.fmt, data_file.compression, hints, min_units)


def file_fields(path: str, fmt: str, compression: str | None,
                context: str | None = None) -> dict[str, str] | None:
    """A file's fields and their kinds as ``zephon check`` names them (``"text"``,
    ``"list<int>"``, ``"list"``, ``"null"``, another type's name), from its schema, first
    line or index; None when nothing tells (an empty JSON Lines file, a plug-in without
    ``fields``)."""
    return _reader(fmt, path, context).fields(path, compression)


def read_unit(path: str, fmt: str, compression: str | None, unit: UnitSpec,
              columns: list[str] | None, display: str,
              context: str | None = None) -> tuple[dict[str, Any], list[int]]:
    """Read one unit's rows, column-wise, and a stable key per row.

    ``columns=None`` reads every column. Keys identify a row inside its file: the row number
    (Parquet, Arrow, compressed JSONL: the line number) or the byte offset of the line
    (uncompressed JSONL). ``display`` names the file in error messages; ``context`` is the
    file's :attr:`~zephon.io.dataset.DataFile.context`.
    """
    reader = _reader(fmt, display, context)
    return _named_errors(lambda: reader.read(path, compression, unit, columns, display), fmt,
                         display)


class _PluginReader:
    """A plug-in :class:`~zephon.io.formats.file_format.FileFormat` behind the built-in format
    modules' calling convention, so every dispatcher above calls one kind of reader: the
    compression and a document range do not apply to plug-ins (they read their own files
    whole), the file's ``context`` does where the plug-in takes one."""

    def __init__(self, fmt: FileFormat, context: str | None):
        self.fmt = fmt
        self.extra = context_keyword(fmt, context)

    def plan(self, path: str, compression: str | None, hints: PlanHints, min_units: int,
             rows: tuple[int, int] | None = None) -> list[UnitSpec]:
        return self.fmt.plan(path, hints, min_units, **self.extra)

    def read(self, path: str, compression: str | None, unit: UnitSpec,
             columns: list[str] | None, display: str) -> tuple[dict[str, Any], list[int]]:
        return self.fmt.read(path, unit, columns, display, **self.extra)

    def fields(self, path: str, compression: str | None) -> dict[str, str] | None:
        return None if self.fmt.fields is None else dict(self.fmt.fields(path, **self.extra))


def _reader(fmt: str, where: str, context: str | None = None) -> Any:
    """The reader of format ``fmt`` (a built-in format's module, or a plug-in behind the same
    calling convention); an unknown format is a DataError naming ``where``."""
    registered = plugin(fmt)
    if registered is not None:
        return _PluginReader(registered, context)
    module = _MODULES.get(fmt)
    if module is None:
        raise DataError(f"unknown format {fmt!r} for {where}; known formats: "
                        f"{', '.join(known_formats())}")
    return module


def _named_errors(call: Any, fmt: str, display: str) -> Any:
    """``call()``, with what a reader raises for an unreadable file as a DataError naming it."""
    try:
        return call()
    except DataError:
        raise
    except _READ_ERRORS as exc:
        raise DataError(f"cannot read {fmt} file {display}: {exc}") from exc


class RowLabel:
    """Names one row of a file in messages: ``file:line`` for JSON Lines (from a byte offset
    the line is counted only when a message is made, so labelling every row costs nothing),
    ``file: row n`` for Parquet and Arrow."""

    __slots__ = ("display", "key", "kind", "path")

    def __init__(self, display: str, path: str, fmt: str, compression: str | None, key: int):
        self.display, self.path, self.key = display, path, key
        self.kind = self._kind(fmt, compression)

    @staticmethod
    def _kind(fmt: str, compression: str | None) -> str:
        registered = plugin(fmt)
        return (registered.row_label if registered is not None else "row"
                if fmt != "jsonl" else "line" if compression else "offset")

    @classmethod
    def labeller(cls, display: str, path: str, fmt: str, compression: str | None
                 ) -> Callable[[int], RowLabel]:
        """Labels for the rows of one file (by key), its kind of label found once for the
        file, not once a row."""
        kind = cls._kind(fmt, compression)

        def label(key: int) -> RowLabel:
            made = cls.__new__(cls)
            made.display, made.path, made.key, made.kind = display, path, key, kind
            return made
        return label

    def position(self) -> str:
        """Where the row is in its file, the same way for every format: ``line N`` (from 1)
        for JSON Lines, plain or compressed (a plain file's byte offset is counted into its
        line here; ``byte N`` when the file is no longer there), ``row N`` (from 0) for
        Parquet, Arrow and indexed datasets, a plug-in's own word (``sample N``) else."""
        if self.kind == "offset":
            try:
                return f"line {line_number(self.path, self.key)}"
            except OSError:  # the file went away (an evicted shard): say where in bytes
                return f"byte {self.key}"
        return f"{self.kind} {self.key}"

    def __str__(self) -> str:
        where = self.position()
        if where.startswith("line "):
            return f"{self.display}:{where[5:]}"
        return f"{self.display}: {where}"

    __repr__ = __str__
