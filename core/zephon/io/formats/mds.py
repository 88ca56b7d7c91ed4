"""Mosaic Streaming's MDS shards (``shard.00000.mds``, or ``.mds.zstd``, ``.mds.gz``,
``.mds.bz2`` when compressed) as a file format (:mod:`zephon.io.file_formats`).

A shard is self-describing, so each file is read on its own, locally or from any object
store, and the dataset's ``index.json`` is not needed (it is skipped as metadata)::

    uint32 samples n | uint32 offsets[n + 1] (absolute) | column config (JSON) | samples

The config names the columns, their encodings and their sizes (``null``: variable). A sample
is the uint32 sizes of its variable-size columns, then every column's bytes in order.

Units are sample ranges (``arrow_unit_rows`` samples at most). A compressed shard is
decompressed whole (a shard is 64 MiB at most by Streaming's default) and the last two are
kept decompressed for the units that follow. Encodings read: ``str``, ``bytes``, ``int``,
the numpy scalars (``uint8`` to ``float64``), ``str_int``, ``str_float``, ``str_decimal``,
``json`` and ``ndarray[:dtype[:shape]]`` (token ids stay arrays). Images (``pil``, ``jpeg``,
``png`` and their lists) are refused by name, as is ``pkl``: unpickling runs code from the
data. Brotli and snappy compression are refused naming the package they would need.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import json
import os
import struct
from decimal import Decimal
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.io.file_formats import FileFormat
from zephon.io.units import PlanHints, UnitSpec, row_units

SUFFIXES = {".mds": None, ".mds.zstd": "zstd", ".mds.gz": "gz", ".mds.bz2": "bz2",
            ".mds.br": "br", ".mds.snappy": "snappy"}
_SCALARS = {name: np.dtype(name) for name in ("uint8", "uint16", "uint32", "uint64", "int8",
                                              "int16", "int32", "int64", "float16",
                                              "float32", "float64")}
_ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16",
                 32: "uint32", 33: "int32", 34: "float32", 64: "uint64", 65: "int64",
                 66: "float64"}
_REFUSED = {"pkl": "unpickling runs code stored in the data",
            **{k: "an image column; zephon reads text and token ids" for k in
               ("pil", "jpeg", "png", "jpeg_array", "jpegarray", "list[pil]", "list[jpeg]",
                "list[png]")}}


def _compression(path: str) -> str | None:
    lower = path.lower()
    return next((c for s, c in sorted(SUFFIXES.items(), key=lambda i: -len(i[0]))
                 if lower.endswith(s)), None)


@functools.lru_cache(maxsize=2)
def _shard(path: str, mtime_ns: int, size: int) -> tuple[bytes, np.ndarray, dict[str, Any]]:
    """(the shard's bytes, its sample offsets, its column config)."""
    compression = _compression(path)
    with open(path, "rb") as fh:
        data = fh.read()
    if compression == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(data).read()
    elif compression == "gz":
        data = gzip.decompress(data)
    elif compression == "bz2":
        data = bz2.decompress(data)
    elif compression is not None:
        package = {"br": "brotli", "snappy": "python-snappy"}[compression]
        raise DataError(f"{path}: {compression}-compressed MDS shards are not read (it would "
                        f"need {package}); write the shards with compression='zstd'")
    if len(data) < 8:
        raise DataError(f"{path}: {len(data)} bytes is too short for an MDS shard")
    (count,) = struct.unpack_from("<I", data)
    head = 4 + 4 * (count + 1)
    if head > len(data):
        raise DataError(f"{path}: not an MDS shard (it claims {count} samples)")
    offsets = np.frombuffer(data, np.uint32, count + 1, 4).astype(np.int64)
    if offsets[0] < head or offsets[-1] != len(data) or np.any(np.diff(offsets) < 0):
        raise DataError(f"{path}: not an MDS shard (its sample offsets do not fit its "
                        f"{len(data)} bytes)")
    try:
        config = json.loads(data[head:offsets[0]])
        names, encodings, sizes = (config["column_names"], config["column_encodings"],
                                   config["column_sizes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: the MDS column config cannot be read ({exc})") from None
    return data, offsets, {"names": names, "encodings": encodings, "sizes": sizes}


def _open(path: str) -> tuple[bytes, np.ndarray, dict[str, Any]]:
    st = os.stat(path)
    return _shard(path, st.st_mtime_ns, st.st_size)


def plan(path: str, hints: PlanHints, min_units: int) -> list[UnitSpec]:
    """Sample ranges of one shard."""
    _, offsets, _ = _open(path)
    return row_units(0, len(offsets) - 1, hints.arrow_unit_rows, min_units)


def _decoder(encoding: str, column: str, display: str) -> Any:
    kind, _, arguments = encoding.partition(":")
    if encoding in _REFUSED:
        raise DataError(f"{display}: column {column!r} is encoded {encoding!r}, which is not "
                        f"read: {_REFUSED[encoding]}. Read other columns (the tokenizer's "
                        "field), or rewrite it")
    if encoding == "str":
        return lambda b: b.decode("utf-8")
    if encoding == "bytes":
        return bytes
    if encoding == "int":
        return lambda b: int.from_bytes(b, "little", signed=True)
    if encoding in _SCALARS:
        dtype = _SCALARS[encoding]
        return lambda b: np.frombuffer(b, dtype)[0].item()
    if encoding == "str_int":
        return lambda b: int(b.decode("utf-8"))
    if encoding == "str_float":
        return lambda b: float(b.decode("utf-8"))
    if encoding == "str_decimal":
        return lambda b: Decimal(b.decode("utf-8"))
    if encoding == "json":
        return lambda b: json.loads(b.decode("utf-8"))
    if kind == "ndarray":
        parts = arguments.split(":") if arguments else []
        fixed = parts[0] if parts else None
        shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
        return functools.partial(_array, fixed, shape)
    raise DataError(f"{display}: column {column!r} has the unknown MDS encoding {encoding!r}")


def _array(dtype: str | None, shape: tuple[int, ...] | None, data: bytes) -> np.ndarray:
    index = 0
    if dtype is None:
        dtype = _ARRAY_DTYPES[data[0]]
        index = 1
    if shape is None:
        ndim, width = data[index] >> 2, 1 << (data[index] & 3)
        index += 1
        shape = tuple(int(d) for d in np.frombuffer(data, f"<u{width}", ndim, index))
        index += ndim * width
    return np.frombuffer(data, dtype, offset=index).reshape(shape)


def read(path: str, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, list[Any]], list[int]]:
    """The samples ``unit.start:unit.stop`` of one shard, column-wise; keys are sample
    indices in the shard."""
    data, offsets, config = _open(path)
    names, encodings, sizes = config["names"], config["encodings"], config["sizes"]
    wanted = names if columns is None else columns
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{display}: has no field(s) {missing}; its fields: "
                        f"{', '.join(names)}")
    decoders = {name: _decoder(encodings[names.index(name)], name, display)
                for name in wanted}
    variable = [i for i, size in enumerate(sizes) if size is None]
    out: dict[str, list[Any]] = {name: [] for name in wanted}
    view = memoryview(data)
    for sample in range(unit.start, unit.stop):
        begin, end = int(offsets[sample]), int(offsets[sample + 1])
        lengths = list(sizes)
        if variable:
            found = struct.unpack_from(f"<{len(variable)}I", data, begin)
            for column, length in zip(variable, found, strict=True):
                lengths[column] = length
        position = begin + 4 * len(variable)
        for column, name in enumerate(names):
            length = lengths[column]
            if name in decoders:
                out[name].append(decoders[name](bytes(view[position:position + length])))
            position += length
        if position != end:
            raise DataError(f"{display}: sample {sample} holds {end - begin} bytes, its "
                            f"columns {position - begin}: the shard is damaged")
    return out, list(range(unit.start, unit.stop))


def fields(path: str) -> dict[str, str]:
    """Each column's kind for ``zephon check``."""
    _, _, config = _open(path)
    kinds = {"str": "text", "bytes": "bytes", "int": "int", "json": "json"}
    out = {}
    for name, encoding in zip(config["names"], config["encodings"], strict=True):
        if encoding.startswith("ndarray"):
            dtype = encoding.split(":")[1] if ":" in encoding else "int"
            out[name] = "list<int>" if "int" in dtype else "list"
        else:
            out[name] = kinds.get(encoding, encoding)
    return out


MDS = FileFormat("mds", tuple(SUFFIXES), plan=plan, read=read, fields=fields,
                 row_label="sample", companions=("index.json",))
"""The format plug-in, registered by :mod:`zephon.io.file_formats` on first use."""
