"""LitData's optimized datasets (the output of ``litdata.optimize``: ``index.json`` and
``chunk-*.bin`` files) as a file format (:mod:`zephon.io.formats.registry`).

A chunk does not describe itself: the field names, each field's encoding and the
compression are only in ``index.json``. So the format has a ``describe`` hook: the listing
reads ``index.json`` once (locally, or with one request from a store, once per job), and each
chunk it names carries its context (item count, fields, encodings, compression) into plans
and reads, so a chunk read from the shard cache needs no index beside it. Planning opens no
chunk.

A chunk (``PyTreeLoader``, LitData's default) is::

    uint32 items n | uint32 offsets[n + 1] (absolute) | items

and an item is the uint32 byte sizes of its leaves, then each leaf's bytes. The item's
pytree must be a dict, whose keys are the fields. LitData stores the rows of dicts of text
(and of nested values: lists, dicts) as an Arrow IPC file appended to the chunk instead
(``... | Arrow IPC | uint32 length | "LDARW01\0"``); those are read with pyarrow, nested values
included, and checked as Arrow files are. Leaf encodings read: ``str``,
``text``, ``bytes``, ``int`` (int64), ``float`` (float64), ``bool``, ``numpy`` and
``no_header_numpy:<dtype>``, ``tensor`` and ``no_header_tensor:<dtype>`` (arrays of token
ids stay numpy arrays). Compression ``zstd`` at each of LitData's levels: ``chunk`` (the
whole file, ``*.zstd.bin``), ``batch`` (frames of items: the ``LDFZ01`` layout) and
``sample`` (each item on its own). A chunk is decompressed whole and the last two are kept,
for the units that follow.

Refused by name: other item loaders (``TokensLoader`` holds one token stream cut into
blocks, with no document boundaries to read documents from), encrypted chunks, leaves of other
encodings (images, audio, ``pickle``: unpickling runs code from the data), and nested values
(LitData's binary ``json`` leaves) in a chunk without an Arrow footer.

Nothing in the index or a chunk is trusted. Every value of the index is checked before use
(:mod:`zephon.field_checks`): a chunk entry needs a file name beside the index, a positive
``chunk_size``, and a ``chunk_bytes`` from 4 bytes an item (an item's offset alone takes 4) up
to :data:`MAX_CHUNK_BYTES`; a bad value is a DataError naming the index, the chunk and the
field. Decompression is bounded before its output is made (:mod:`.decompress`): a
``chunk``-level file by the bytes its index declares, a ``batch`` frame by the size its frame
table declares, and everything by :data:`MAX_CHUNK_BYTES`. A chunk's header, offsets, frame
table and every item's leaf sizes must fit its bytes exactly, and a leaf that does not decode
is a DataError naming the chunk, the item and the field.

Units are item ranges (``arrow_unit_rows`` items at most); a row's key is its item index in
the chunk.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from zephon.errors import DataError
from zephon.field_checks import (
    StateFieldError,
    item,
    join,
    need_dict,
    need_int,
    need_list,
    need_str,
    reported_as,
)
from zephon.io.formats.arrow_columns import check_arrow, check_columns, table_columns
from zephon.io.formats.decompress import decompress
from zephon.io.formats.file_format import FileFormat
from zephon.io.units import PlanHints, UnitSpec, row_units

MAX_CHUNK_BYTES = 1 << 30
"""The most bytes a chunk may hold, decompressed (1 GiB; LitData writes chunks of its
``chunk_bytes`` option, 64 MB unless told otherwise): a larger chunk, or an index that says
so, is refused by name rather than allocated. The last two chunks read are kept."""

_NUMPY_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
"""LitData's numpy dtype codes (the index into this tuple), as far as numbers go."""
_TORCH_DTYPES = {0: "float32", 1: "float32", 2: "float64", 3: "float64", 8: "float16",
                 9: "float16", 11: "uint8", 12: "int8", 13: "int16", 14: "int16",
                 15: "int32", 16: "int32", 17: "int64", 18: "int64", 19: "bool",
                 20: "uint16"}
"""LitData's torch dtype codes that numpy holds as they are."""
_SCALARS = {"str", "text", "bytes", "int", "float", "bool"}
_FRAMED_MAGIC = b"LDFZ01\0\0"
_ARROW_MAGIC = b"LDARW01\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")
_FRAME = struct.Struct("<IIQII")
_KINDS = {"str": "text", "text": "text", "bytes": "bytes", "int": "int", "float": "float",
          "bool": "bool"}


def _field_names(config: dict[str, Any], display: str) -> tuple[list[str], bool]:
    """The keys of the dict each item is, from LitData's serialized pytree spec, and whether
    every value is a leaf (else the rows are only readable from an Arrow footer)."""
    with reported_as(DataError, display):
        text = need_str(config.get("data_spec"), "config.data_spec")
    try:
        _, spec = json.loads(text)
        children = spec["children_spec"]
        names = json.loads(spec["context"]) if spec["type"] == "builtins.dict" else None
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{display}: unreadable data_spec in its config ({exc})") from None
    if names is None:
        raise DataError(f"{display}: items are {spec.get('type')} pytrees; zephon reads "
                        "LitData items that are a dict (field name -> value)")
    with reported_as(DataError, display):
        path = "config.data_spec.context"
        names = [need_str(n, item(path, i)) for i, n in enumerate(need_list(names, path))]
        path = "config.data_spec.children_spec"
        flat = all(need_dict(c, item(path, i)).get("type") is None
                   for i, c in enumerate(need_list(children, path)))
    if len(set(names)) != len(names):
        raise DataError(f"{display}: its config names a field twice ({names})")
    return names, flat


def _encoding_problem(encoding: str) -> str | None:
    """Why a leaf encoding is not read, or None when it is."""
    base, _, code = encoding.partition(":")
    known = (encoding in _SCALARS or encoding in ("numpy", "tensor", "json")
             or (base == "no_header_numpy" and code.isdigit()
                 and int(code) < len(_NUMPY_DTYPES))
             or (base == "no_header_tensor" and code.isdigit() and int(code) in _TORCH_DTYPES))
    if known:
        return None
    why = ("unpickling runs code stored in the data" if base == "pickle"
           else "zephon reads text, numbers and token-id arrays")
    return f"is encoded as {encoding!r}, which is not read ({why})"


def _required(entry: dict[str, Any], name: str, path: str) -> Any:
    if name not in entry:
        raise StateFieldError(join(path, name), "is missing")
    return entry[name]


def describe(index: bytes, display: str) -> dict[str, str] | None:
    """``{chunk file name: context}`` from a LitData ``index.json``; None for another
    format's ``index.json`` (MDS's has ``shards``, not ``chunks`` and ``config``). Every
    value used is checked first (see the module docstring)."""
    try:
        parsed = json.loads(index)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not {"chunks", "config"} <= set(parsed):
        return None
    config = parsed["config"]
    if not isinstance(config, dict):
        raise DataError(f"{display}: a LitData index with no config (an optimize run that "
                        "wrote no chunks?)")
    with reported_as(DataError, display):
        loader = need_str(config.get("item_loader", "PyTreeLoader"), "config.item_loader")
    if loader != "PyTreeLoader":
        raise DataError(f"{display}: items stored by LitData's {loader}, which zephon does "
                        "not read (a TokensLoader dataset is one token stream cut into "
                        "blocks: it has no documents). Write the dataset with the default "
                        "loader, one document an item")
    if config.get("encryption"):
        raise DataError(f"{display}: encrypted LitData chunks are not read")
    names, flat = _field_names(config, display)
    with reported_as(DataError, display):
        path = "config.data_format"
        encodings = [need_str(e, item(path, i))
                     for i, e in enumerate(need_list(config.get("data_format") or [], path))]
        compression = config.get("compression")
        if compression is not None:
            need_str(compression, "config.compression")
        level = config.get("compression_level") or "chunk"
        if level not in _LEVELS:
            raise StateFieldError("config.compression_level",
                                  f"is {level!r}, must be one of {', '.join(_LEVELS)}")
        types = config.get("types")
        types = need_dict(types, "config.types") if types is not None else {}
    if flat and len(encodings) != len(names):
        raise DataError(f"{display}: {len(names)} fields but {len(encodings)} encodings in "
                        "its config")
    for name, encoding in zip(names, encodings if flat else [], strict=False):
        problem = _encoding_problem(encoding)
        if problem:
            raise DataError(f"{display}: field {name!r} {problem}")
    if compression not in (None, "zstd") and not compression.startswith("zstd:"):
        raise DataError(f"{display}: {compression!r}-compressed chunks are not read "
                        "(zstd is)")
    shared = {"fields": names, "encodings": encodings if flat else None,
              "types": {n: (t if isinstance(t := types.get(n), str) else
                            t.get("type") if isinstance(t, dict) else None) for n in names},
              "compression": compression, "level": level}
    contexts: dict[str, str] = {}
    with reported_as(DataError, display):
        chunks = need_list(parsed["chunks"], "chunks")
    for i, chunk in enumerate(chunks):
        path = item("chunks", i)
        with reported_as(DataError, display):
            entry = need_dict(chunk, path)
            name = need_str(_required(entry, "filename", path), join(path, "filename"))
            if name in ("", ".", "..") or "/" in name or "\\" in name:
                raise StateFieldError(join(path, "filename"),
                                      f"is {name!r}, must name a file beside the index")
        with reported_as(DataError, f"{display} (chunk {name})"):
            if name in contexts:
                raise StateFieldError(join(path, "filename"), "names a chunk a second time")
            items = need_int(_required(entry, "chunk_size", path), join(path, "chunk_size"),
                             low=1)
            size = need_int(_required(entry, "chunk_bytes", path), join(path, "chunk_bytes"),
                            low=1, high=MAX_CHUNK_BYTES)
            if 4 * items > size:
                raise StateFieldError(join(path, "chunk_size"),
                                      f"is {items}, more items than its {size} bytes "
                                      "(chunk_bytes) hold at 4 bytes an item")
        contexts[name] = json.dumps({**shared, "items": items, "bytes": size})
    return contexts


_LEVELS = ("chunk", "batch", "sample")


@functools.lru_cache(maxsize=64)
def _parsed(context: str) -> dict[str, Any]:
    """A context :func:`describe` made, checked again: it comes back from listings handed
    between ranks and from saved plans."""
    try:
        described = need_dict(json.loads(context), "")
    except ValueError as exc:
        raise StateFieldError("", f"is not JSON ({exc})") from None
    for name in ("fields", "encodings", "types", "compression", "level", "items", "bytes"):
        _required(described, name, "")
    names = need_list(described["fields"], "fields")
    for i, name in enumerate(names):
        need_str(name, item("fields", i))
    if described["encodings"] is not None:
        encodings = need_list(described["encodings"], "encodings", len(names))
        for i, encoding in enumerate(encodings):
            problem = _encoding_problem(need_str(encoding, item("encodings", i)))
            if problem:
                raise StateFieldError(item("encodings", i), problem)
    need_dict(described["types"], "types")
    if described["compression"] is not None:
        need_str(described["compression"], "compression")
    if described["level"] not in _LEVELS:
        raise StateFieldError("level", f"is {described['level']!r}, must be one of "
                                       f"{', '.join(_LEVELS)}")
    size = need_int(described["bytes"], "bytes", 1, MAX_CHUNK_BYTES)
    need_int(described["items"], "items", 1, size // 4)
    return described


def _context(context: str, display: str) -> dict[str, Any]:
    with reported_as(DataError, f"{display}: its LitData context (from index.json, a listing "
                                "or a saved plan)"):
        return _parsed(context)


def _items_of(data: bytes, context: dict[str, Any], display: str) -> tuple[bytes, np.ndarray]:
    """(a buffer, the n + 1 offsets of its items in it) from a chunk file's bytes, its
    header and offsets checked against its bytes and its index."""
    level = context["level"] if context["compression"] else None
    if level == "batch":
        return _framed_items(data, context, display)
    if len(data) < 8:
        raise DataError(f"{display}: {len(data)} bytes is too short for a LitData chunk")
    (count,) = struct.unpack_from("<I", data)
    _check_count(count, context, display)
    head = 4 + 4 * (count + 1)
    if head > len(data):
        raise DataError(f"{display}: its header names {count} items, more than its "
                        f"{len(data)} bytes hold")
    offsets = np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)
    if offsets[0] < head or np.any(np.diff(offsets) < 0) or offsets[-1] > len(data):
        raise DataError(f"{display}: its item offsets run past its {len(data)} bytes or "
                        "out of order (a damaged or truncated chunk)")
    if offsets[-1] == offsets[0]:
        raise DataError(f"{display}: holds no item bytes: LitData kept its rows in an Arrow "
                        "footer after its header, which is missing (a truncated chunk)")
    if level != "sample":
        return data, offsets
    view, pieces, left = memoryview(data), [], MAX_CHUNK_BYTES
    for i in range(count):
        piece = decompress(view[offsets[i]:offsets[i + 1]], "zstd", left,
                           f"{display}: item {i}", f"what is left of the {MAX_CHUNK_BYTES} "
                           "bytes a chunk may hold")
        left -= len(piece)
        pieces.append(piece)
    sizes = np.fromiter((len(p) for p in pieces), np.int64, count)
    return b"".join(pieces), np.concatenate([[0], np.cumsum(sizes)])


def _check_count(count: int, context: dict[str, Any], display: str) -> None:
    if count != context["items"]:
        raise DataError(f"{display}: holds {count} items, its index says {context['items']}")


def _framed_items(data: bytes, context: dict[str, Any], display: str
                  ) -> tuple[bytes, np.ndarray]:
    """The items of a ``batch``-level chunk: its frame table must cover its items in order,
    each frame within the file and decompressing to exactly the bytes it declares."""
    if len(data) < _FRAMED_PREFIX.size or data[:8] != _FRAMED_MAGIC:
        raise DataError(f"{display}: not a framed zstd LitData chunk")
    _, version, _, count, _, frames = _FRAMED_PREFIX.unpack_from(data)
    if version != 1:
        raise DataError(f"{display}: framed zstd version {version} is not read")
    _check_count(count, context, display)
    table = _FRAMED_PREFIX.size + 4 * (count + 1)
    head = table + _FRAME.size * frames
    if head > len(data):
        raise DataError(f"{display}: its header names {count} items in {frames} frames, more "
                        f"than its {len(data)} bytes hold")
    offsets = np.frombuffer(data, "<u4", count + 1, _FRAMED_PREFIX.size).astype(np.int64)
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise DataError(f"{display}: its item offsets are out of order (a damaged chunk)")
    view, parts, first, total = memoryview(data), [], 0, 0
    for i in range(frames):
        first_item, items, start, length, raw = _FRAME.unpack_from(data, table + i * _FRAME.size)
        last = first_item + items
        if (first_item != first or last > count or start < head or start + length > len(data)
                or raw != offsets[last] - offsets[first_item]):
            raise DataError(f"{display}: frame {i} of its frame table does not fit its items "
                            "and bytes (a damaged chunk)")
        part = decompress(view[start:start + length], "zstd", raw, f"{display}: frame {i}",
                          f"the {raw} bytes its frame table declares")
        if len(part) != raw:
            raise DataError(f"{display}: frame {i} holds {len(part)} bytes, not {raw}")
        parts.append(part)
        first, total = last, total + raw
    if first != count:
        raise DataError(f"{display}: its frames hold {first} of its {count} items")
    return b"".join(parts), offsets


def _arrow_rows(data: bytes, display: str) -> pa.Table | None:
    """The rows of a chunk's Arrow footer, or None when it has none."""
    if len(data) < 12 or data[-8:] != _ARROW_MAGIC:
        return None
    (length,) = struct.unpack_from("<I", data, len(data) - 12)
    start = len(data) - 12 - length
    if start < 0:
        raise DataError(f"{display}: its Arrow footer claims {length} bytes, more than the "
                        "chunk holds")
    ipc = pa.py_buffer(data)[start:start + length]
    try:
        try:
            return pa.ipc.open_file(ipc).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_stream(ipc).read_all()
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise DataError(f"{display}: its Arrow footer cannot be read ({exc})") from None


@functools.lru_cache(maxsize=2)
def _chunk(path: str, mtime_ns: int, size: int, context: str,
           display: str) -> pa.Table | tuple[bytes, np.ndarray]:
    """A chunk's rows: an Arrow table (from its footer) or (a buffer, its item offsets)."""
    described = _context(context, display)
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > MAX_CHUNK_BYTES:
            raise DataError(f"{display}: larger than {MAX_CHUNK_BYTES} bytes, the most a LitData "
                            "chunk may hold here; write the dataset with a smaller chunk_bytes")
        data = fh.read()
    expected = described["items"]
    rows = _arrow_rows(data, display)
    if rows is None and described["compression"] and described["level"] == "chunk":
        # LitData declares a chunk's bytes before compressing it; older versions counted its
        # items only, without the header (4 bytes an item, and 8), which the bound allows.
        bound = min(MAX_CHUNK_BYTES, described["bytes"] + 4 * (expected + 2))
        data = decompress(data, "zstd", bound, display,
                          f"the {described['bytes']} bytes its index declares")
        rows = _arrow_rows(data, display)
    if rows is not None:
        if rows.num_rows != expected:
            raise DataError(f"{display}: holds {rows.num_rows} rows, its index says "
                            f"{expected}")
        return rows
    nested = [name for name, encoding in zip(described["fields"], described["encodings"] or [],
                                             strict=False) if encoding == "json"]
    if described["encodings"] is None or nested:
        raise DataError(f"{display}: nested values ({', '.join(nested) or 'the items'}) in a "
                        "chunk with no Arrow footer: zephon reads them only from the Arrow "
                        "rows LitData writes beside them")
    return _items_of(data, described, display)


def _leaf(encoding: str, raw: memoryview) -> Any:
    if encoding in ("str", "text"):
        return str(raw, "utf-8")
    if encoding == "bytes":
        return bytes(raw)
    if encoding == "int":
        return struct.unpack("<q", raw)[0]
    if encoding == "float":
        return struct.unpack("<d", raw)[0]
    if encoding == "bool":
        return raw[0] != 0
    base, _, code = encoding.partition(":")
    if base == "no_header_numpy":
        return np.frombuffer(raw, _NUMPY_DTYPES[int(code)]).copy()
    if base == "no_header_tensor":
        return np.frombuffer(raw, _TORCH_DTYPES[int(code)]).copy()
    order = "<" if encoding == "numpy" else ">"  # tensor: a big-endian header
    dtype, ndim = struct.unpack_from(f"{order}II", raw)
    if 8 + 4 * ndim > len(raw):
        raise ValueError(f"its header names {ndim} dimensions, more than its {len(raw)} "
                         "bytes hold")
    shape = struct.unpack_from(f"{order}{ndim}I", raw, 8)
    dtypes = _NUMPY_DTYPES if encoding == "numpy" else _TORCH_DTYPES
    return np.frombuffer(raw[8 + 4 * ndim:], dtypes[dtype]).reshape(shape).copy()


_LEAF_ERRORS = (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error)
"""What decoding a damaged leaf raises (UnicodeDecodeError is a ValueError)."""


def plan(path: str, hints: PlanHints, min_units: int, *, context: str) -> list[UnitSpec]:
    """Item ranges of a chunk, from its item count in the index (the chunk is not opened)."""
    return row_units(0, _context(context, path)["items"], hints.arrow_unit_rows, min_units)


def read(path: str, unit: UnitSpec, columns: list[str] | None, display: str, *,
         context: str) -> tuple[dict[str, Any], list[int]]:
    """Items ``unit.start..unit.stop`` of a chunk, column-wise."""
    described = _context(context, display)
    names, encodings = described["fields"], described["encodings"]
    if not 0 <= unit.start <= unit.stop <= described["items"]:
        raise DataError(f"{display}: items {unit.start}..{unit.stop} asked of a chunk of "
                        f"{described['items']}")
    wanted = names if columns is None else columns
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{display}: no field {missing[0]!r} (fields: {names})")
    stat = os.stat(path)
    chunk = _chunk(path, stat.st_mtime_ns, stat.st_size, context, display)
    if isinstance(chunk, pa.Table):
        table = chunk.slice(unit.start, unit.stop - unit.start)
        check_columns(table.column_names, wanted, display)
        check_arrow(table, wanted, unit.start, display)
        return table_columns(table, wanted, display), list(range(unit.start, unit.stop))
    buffer, offsets = chunk
    view = memoryview(buffer)
    picks = [(names.index(c), c) for c in wanted]
    out: dict[str, list[Any]] = {c: [] for c in wanted}
    leaves = len(names)
    for index in range(unit.start, unit.stop):
        start, stop = int(offsets[index]), int(offsets[index + 1])
        if stop > len(buffer) or start + 4 * leaves > stop:
            raise DataError(f"{display}: item {index} runs past its slot or the chunk's "
                            f"{len(buffer)} bytes (a damaged chunk)")
        sizes = np.frombuffer(buffer, "<u4", leaves, start)
        ends = start + 4 * leaves + np.cumsum(sizes, dtype=np.int64)
        if ends[-1] != stop:
            longer = "longer" if ends[-1] > stop else "shorter"
            raise DataError(f"{display}: item {index} is {longer} than its slot (its leaves "
                            f"{int(ends[-1]) - start} bytes, its slot {stop - start}: a "
                            "damaged chunk)")
        for field, column in picks:
            end = int(ends[field])
            try:
                value = _leaf(encodings[field], view[end - int(sizes[field]):end])
            except _LEAF_ERRORS as exc:
                raise DataError(f"{display}: item {index}: field {column!r} "
                                f"({encodings[field]}) cannot be decoded ({exc})") from None
            out[column].append(value)
    return out, list(range(unit.start, unit.stop))


def fields(path: str, *, context: str) -> dict[str, str]:
    """The fields and their kinds as ``zephon check`` names them, from the index."""
    described = _context(context, path)
    if described["encodings"] is None:  # nested items: the writer's types name the fields
        return {name: _KINDS.get(kind, "list") for name, kind in described["types"].items()}
    kinds = {}
    for name, encoding in zip(described["fields"], described["encodings"], strict=True):
        base, _, code = encoding.partition(":")
        dtype = (_NUMPY_DTYPES[int(code)] if base == "no_header_numpy"
                 else _TORCH_DTYPES[int(code)] if base == "no_header_tensor" else None)
        kinds[name] = (_KINDS.get(encoding)
                       or ("list<int>" if dtype is not None and dtype.startswith(("int", "uint"))
                           else "list"))
    return kinds


LITDATA = FileFormat("litdata", (), plan=plan, read=read, fields=fields, row_label="item",
                     companions=("index.json",), describe=describe)
