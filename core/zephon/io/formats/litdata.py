"""LitData's optimized datasets (the output of ``litdata.optimize``: ``index.json`` and
``chunk-*.bin`` files) as a file format (:mod:`zephon.io.file_formats`).

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
from zephon.io.file_formats import FileFormat
from zephon.io.formats.arrow_columns import check_arrow, check_columns, table_columns
from zephon.io.units import PlanHints, UnitSpec, row_units

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
    try:
        _, spec = json.loads(config["data_spec"])
        children = spec["children_spec"]
        names = json.loads(spec["context"]) if spec["type"] == "builtins.dict" else None
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{display}: unreadable data_spec in its config ({exc})") from None
    if names is None:
        raise DataError(f"{display}: items are {spec.get('type')} pytrees; zephon reads "
                        "LitData items that are a dict (field name -> value)")
    return [str(name) for name in names], all(c.get("type") is None for c in children)


def _checked_encoding(encoding: str, field: str, display: str) -> str:
    base, _, code = encoding.partition(":")
    known = (encoding in _SCALARS or encoding in ("numpy", "tensor", "json")
             or (base == "no_header_numpy" and code.isdigit()
                 and int(code) < len(_NUMPY_DTYPES))
             or (base == "no_header_tensor" and code.isdigit() and int(code) in _TORCH_DTYPES))
    if not known:
        why = ("unpickling runs code stored in the data" if base == "pickle"
               else "zephon reads text, numbers and token-id arrays")
        raise DataError(f"{display}: field {field!r} is encoded as {encoding!r}, which is not "
                        f"read ({why})")
    return encoding


def describe(index: bytes, display: str) -> dict[str, str] | None:
    """``{chunk file name: context}`` from a LitData ``index.json``; None for another
    format's ``index.json`` (MDS's has ``shards``, not ``chunks`` and ``config``)."""
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
    loader = config.get("item_loader", "PyTreeLoader")
    if loader != "PyTreeLoader":
        raise DataError(f"{display}: items stored by LitData's {loader}, which zephon does "
                        "not read (a TokensLoader dataset is one token stream cut into "
                        "blocks: it has no documents). Write the dataset with the default "
                        "loader, one document an item")
    if config.get("encryption"):
        raise DataError(f"{display}: encrypted LitData chunks are not read")
    names, flat = _field_names(config, display)
    encodings = list(config.get("data_format") or [])
    if flat and len(encodings) != len(names):
        raise DataError(f"{display}: {len(names)} fields but {len(encodings)} encodings in "
                        "its config")
    types = config.get("types") if isinstance(config.get("types"), dict) else {}
    shared = {"fields": names,
              "encodings": ([_checked_encoding(e, n, display)
                             for e, n in zip(encodings, names, strict=True)] if flat else None),
              "types": {n: (t if isinstance(t := types.get(n), str) else
                            t.get("type") if isinstance(t, dict) else None) for n in names},
              "compression": config.get("compression"),
              "level": config.get("compression_level") or "chunk"}
    if shared["compression"] not in (None, "zstd") and not str(
            shared["compression"]).startswith("zstd:"):
        raise DataError(f"{display}: {shared['compression']!r}-compressed chunks are not read "
                        "(zstd is)")
    contexts = {}
    for chunk in parsed["chunks"]:
        try:
            contexts[str(chunk["filename"])] = json.dumps({**shared,
                                                           "items": int(chunk["chunk_size"])})
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{display}: a chunk entry without filename and chunk_size: "
                            f"{chunk!r}") from None
    return contexts


@functools.lru_cache(maxsize=64)
def _context(context: str) -> dict[str, Any]:
    return json.loads(context)


def _zstd(data: bytes | memoryview) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(bytes(data)).read()


def _items_of(data: bytes, context: dict[str, Any], display: str) -> tuple[bytes, np.ndarray]:
    """(a buffer, the n + 1 offsets of its items in it) from a chunk file's bytes."""
    level = context["level"] if context["compression"] else None
    if level == "batch":
        if data[:8] != _FRAMED_MAGIC:
            raise DataError(f"{display}: not a framed zstd LitData chunk")
        _, version, _, count, _, frames = _FRAMED_PREFIX.unpack_from(data)
        if version != 1:
            raise DataError(f"{display}: framed zstd version {version} is not read")
        offsets = np.frombuffer(data, "<u4", count + 1, _FRAMED_PREFIX.size).astype(np.int64)
        table = _FRAMED_PREFIX.size + 4 * (count + 1)
        parts = []
        for i in range(frames):
            _, _, start, length, raw = _FRAME.unpack_from(data, table + i * _FRAME.size)
            part = _zstd(memoryview(data)[start:start + length])
            if len(part) != raw:
                raise DataError(f"{display}: frame {i} holds {len(part)} bytes, not {raw}")
            parts.append(part)
        return b"".join(parts), offsets
    if len(data) < 8:
        raise DataError(f"{display}: {len(data)} bytes is too short for a LitData chunk")
    (count,) = struct.unpack_from("<I", data)
    head = 4 + 4 * (count + 1)
    if head > len(data):
        raise DataError(f"{display}: its header names {count} items, more than its "
                        f"{len(data)} bytes hold")
    offsets = np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)
    if level == "sample":
        pieces = [_zstd(memoryview(data)[offsets[i]:offsets[i + 1]]) for i in range(count)]
        sizes = np.fromiter((len(p) for p in pieces), np.int64, count)
        return b"".join(pieces), np.concatenate([[0], np.cumsum(sizes)])
    return data, offsets


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
        return pa.ipc.open_file(ipc).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(ipc).read_all()


@functools.lru_cache(maxsize=2)
def _chunk(path: str, mtime_ns: int, size: int, context: str,
           display: str) -> pa.Table | tuple[bytes, np.ndarray]:
    """A chunk's rows: an Arrow table (from its footer) or (a buffer, its item offsets)."""
    with open(path, "rb") as fh:
        data = fh.read()
    described = _context(context)
    expected = described["items"]
    rows = _arrow_rows(data, display)
    if rows is None and described["compression"] and described["level"] == "chunk":
        data = _zstd(data)
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
    buffer, offsets = _items_of(data, described, display)
    if len(offsets) != expected + 1:
        raise DataError(f"{display}: holds {len(offsets) - 1} items, its index says "
                        f"{expected}")
    if len(offsets) > 1 and (offsets[-1] > len(buffer) or np.any(np.diff(offsets) < 0)):
        raise DataError(f"{display}: its item offsets run past its {len(buffer)} bytes "
                        "(a damaged or truncated chunk)")
    return buffer, offsets


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
    if encoding == "numpy":
        dtype, ndim = struct.unpack_from("<II", raw)
        shape = struct.unpack_from(f"<{ndim}I", raw, 8)
        return np.frombuffer(raw[8 + 4 * ndim:], _NUMPY_DTYPES[dtype]).reshape(shape).copy()
    dtype, ndim = struct.unpack_from(">II", raw)  # tensor: a big-endian header
    shape = struct.unpack_from(f">{ndim}I", raw, 8)
    return np.frombuffer(raw[8 + 4 * ndim:], _TORCH_DTYPES[dtype]).reshape(shape).copy()


def plan(path: str, hints: PlanHints, min_units: int, *, context: str) -> list[UnitSpec]:
    """Item ranges of a chunk, from its item count in the index (the chunk is not opened)."""
    return row_units(0, _context(context)["items"], hints.arrow_unit_rows, min_units)


def read(path: str, unit: UnitSpec, columns: list[str] | None, display: str, *,
         context: str) -> tuple[dict[str, Any], list[int]]:
    """Items ``unit.start..unit.stop`` of a chunk, column-wise."""
    described = _context(context)
    names, encodings = described["fields"], described["encodings"]
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
    for item in range(unit.start, unit.stop):
        start = int(offsets[item])
        sizes = np.frombuffer(buffer, "<u4", leaves, start)
        ends = start + 4 * leaves + np.cumsum(sizes, dtype=np.int64)
        if ends[-1] > offsets[item + 1]:
            raise DataError(f"{display}: item {item} is longer than its slot (a damaged "
                            "chunk)")
        for index, column in picks:
            stop = int(ends[index])
            out[column].append(_leaf(encodings[index], view[stop - int(sizes[index]):stop]))
    return out, list(range(unit.start, unit.stop))


def fields(path: str, *, context: str) -> dict[str, str]:
    """The fields and their kinds as ``zephon check`` names them, from the index."""
    described = _context(context)
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
