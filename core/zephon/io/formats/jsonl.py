"""JSON Lines, plain or compressed (``.gz``, ``.zst``; ``.json`` is read as JSON Lines). A unit
of a plain file is a byte range, and owns the lines that *start* inside it, so ranges need no
alignment; a compressed file is one unit (gzip and zstd streams cannot be entered in the
middle). Lines are parsed one by one, so an error names its line; the JSON parser checks the
text."""

from __future__ import annotations

import codecs
import json
import math
import re
import sys
from json.decoder import scanstring
from pathlib import Path
from typing import Any

import pyarrow as pa

from zephon.errors import DataError
from zephon.io.formats.file_format import FieldKinds
from zephon.io.units import PlanHints, UnitSpec

SUFFIXES = {".jsonl": None, ".json": None, ".ndjson": None, ".jsonl.gz": "gzip",
            ".json.gz": "gzip", ".jsonl.zst": "zstd", ".json.zst": "zstd"}


def plan(path: str, compression: str | None, hints: PlanHints, min_units: int,
         rows: tuple[int, int] | None = None) -> list[UnitSpec]:
    """Byte ranges of about ``hints.unit_bytes``, or the whole file when compressed."""
    if compression is not None:
        return [UnitSpec("file", 0, 0, -1)]
    return byte_units(Path(path).stat().st_size, hints.unit_bytes, min_units)


FIELDS_PREFIX_BYTES = 1 << 20
"""The most bytes :func:`fields` reads of a file (1 MiB): a first line that is longer is read
no further, so ``zephon check`` costs the same for a line of 20 MB as of 1 MiB."""
_READ_STEP = 1 << 16
_NOT_BLANK = re.compile(rb"[^ \t\n\r\f\v]")


def fields(path: str, compression: str | None) -> dict[str, str] | None:
    """The fields of the file's first line and their kinds (``"text"``, ``"list<int>"``,
    ``"list"``, ``"null"``, another type's name); None when the file has no line to tell.

    At most :data:`FIELDS_PREFIX_BYTES` are read. A longer first line gives the fields that
    begin in that prefix, each value's kind from as much of it as the prefix holds, as a
    :class:`~zephon.io.formats.registry.FieldKinds` marked incomplete: a field that is not among
    them may come later in the line."""
    line, whole = _first_line(path, compression, FIELDS_PREFIX_BYTES)
    if whole:
        if not line:
            return None
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path}:1: malformed JSON line ({exc})") from None
        except RecursionError:
            raise DataError(f"{path}:1: the JSON on this line nests deeper than Python can "
                            "parse") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:1: expected a JSON object, got {type(row).__name__}")
        return {name: _json_kind(value) for name, value in row.items()}
    note = (f"its first line is longer than the {FIELDS_PREFIX_BYTES} bytes zephon check "
            "reads")
    if not line:
        return FieldKinds({}, complete=False, note=f"its first {FIELDS_PREFIX_BYTES} bytes "
                                                   "are blank")
    return FieldKinds(_prefix_kinds(line, path), complete=False, note=note)


def _first_line(path: str, compression: str | None, limit: int) -> tuple[bytes, bool]:
    """(the first line that is not blank, without its newline, and whether it is whole), from
    at most ``limit`` bytes of the file, each byte looked at once."""
    buffer = bytearray()
    start = -1
    with pa.input_stream(path, compression=compression) as stream:
        while len(buffer) < limit:
            chunk = stream.read(min(_READ_STEP, limit - len(buffer)))
            if not chunk:
                return (bytes(memoryview(buffer)[start:]) if start >= 0 else b""), True
            seen = len(buffer)
            buffer += chunk
            if start < 0:
                found = _NOT_BLANK.search(buffer, seen)
                if found is None:
                    continue
                start = found.start()
            end = buffer.find(b"\n", max(start, seen))
            if end >= 0:
                return bytes(memoryview(buffer)[start:end]), True
    return (bytes(memoryview(buffer)[start:]) if start >= 0 else b""), False


def _prefix_kinds(prefix: bytes, path: str) -> dict[str, str]:
    """The fields that begin in ``prefix``, the start of a JSON object cut anywhere, with
    their kinds; scanning stops at the first value the prefix cuts (whose kind its first
    characters give) or does not parse."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(prefix, final=False)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:1: malformed JSON line ({exc})") from None
    decoder = json.JSONDecoder()
    end = len(text)
    i = _skip_blank(text, 0)
    if i >= end:
        return {}
    if text[i] != "{":
        raise DataError(f"{path}:1: expected a JSON object, got {_cut_kind(text, i)}")
    kinds: dict[str, str] = {}
    i += 1
    while True:
        i = _skip_blank(text, i)
        if i >= end or text[i] != '"':
            return kinds
        try:
            name, i = scanstring(text, i + 1)
        except ValueError:
            return kinds  # the name runs past the prefix
        i = _skip_blank(text, i)
        if i >= end or text[i] != ":":
            return kinds
        i = _skip_blank(text, i + 1)
        if i >= end:
            return kinds
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            kinds[name] = _cut_kind(text, i)
            return kinds
        kinds[name] = _json_kind(value)
        i = _skip_blank(text, i)
        if i >= end or text[i] != ",":
            return kinds
        i += 1


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _cut_kind(text: str, i: int) -> str:
    """The kind of a JSON value that starts at ``text[i]`` and runs past the text's end."""
    first = text[i:i + 1]
    if first == "[":
        return _cut_list_kind(text, i)
    number = re.match(r"-?[0-9]+([.eE])?", text[i:i + 64])
    if number:
        return "float" if number.group(1) else "int"
    return {'"': "text", "{": "dict", "t": "bool", "f": "bool", "n": "null"}.get(first,
                                                                                  "unknown")


def _cut_list_kind(text: str, i: int) -> str:
    """``"list<int>"`` when every item of a cut list that the text holds whole is an integer
    (one at least), else ``"list"``."""
    decoder = json.JSONDecoder()
    i = _skip_blank(text, i + 1)
    items = 0
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            break
        if not isinstance(value, int) or isinstance(value, bool):
            return "list"
        items += 1
        i = _skip_blank(text, i)
        if text[i:i + 1] != ",":
            break
        i = _skip_blank(text, i + 1)
    return "list<int>" if items else "list"


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        is_ids = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        return "list<int>" if value and is_ids else "list"
    return type(value).__name__


def read(path: str, compression: str | None, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, list[Any]], list[int]]:
    """A unit's rows; a row's key is its line number (compressed) or the byte offset of its
    line."""
    return _read_jsonl(path, compression, unit, columns, display)


def byte_units(size: int, unit_bytes: int, min_units: int) -> list[UnitSpec]:
    """The units of an uncompressed JSON Lines file of ``size`` bytes: byte ranges of about
    ``unit_bytes`` (at least ``min_units`` of them while each holds a byte); a reader starts
    at the first line that begins inside its range."""
    if size == 0:
        return []
    n = min(max(math.ceil(size / unit_bytes), min_units), size)
    step = math.ceil(size / n)
    return [UnitSpec("bytes", 0, s, min(s + step, size)) for s in range(0, size, step)]


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


def line_number(path: str, offset: int) -> int:
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
            line = number if number is not None else line_number(path, offset)
            hint = _json_hint(path, raw)
            raise DataError(f"{display}:{line}: malformed JSON line ({exc}){hint}") from None
        except RecursionError:
            line = number if number is not None else line_number(path, offset)
            raise DataError(f"{display}:{line}: the JSON on this line nests deeper than Python "
                            f"can parse (limit {sys.getrecursionlimit()} levels); flatten it or "
                            "leave the file out") from None
        if not isinstance(value, dict):
            line = number if number is not None else line_number(path, offset)
            raise DataError(f"{display}:{line}: expected a JSON object, got "
                            f"{type(value).__name__}")
        if columns is not None:
            for name in columns:
                if name not in value:
                    line = number if number is not None else line_number(path, offset)
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
