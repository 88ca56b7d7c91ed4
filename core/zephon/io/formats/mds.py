"""Mosaic Streaming's MDS shards (``shard.00000.mds``, or ``.mds.zstd``, ``.mds.gz``,
``.mds.bz2`` when compressed) as a file format (:mod:`zephon.io.formats.registry`).

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

Nothing in a shard is trusted: a compressed shard is decompressed only up to
:data:`MAX_SHARD_BYTES` (:mod:`.decompress`), its offsets must fit its bytes, its column config
must be a dict of names, encodings and sizes of one length each (checked with
:mod:`zephon.field_checks`), every sample's column sizes must add up to its slot exactly, and
a value that does not decode is a DataError naming the shard, the sample and the column.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from decimal import Decimal
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.field_checks import (
    StateFieldError,
    item,
    need_dict,
    need_int,
    need_list,
    need_str,
    reported_as,
)
from zephon.io.formats.decompress import decompress
from zephon.io.formats.file_format import FileFormat
from zephon.io.units import PlanHints, UnitSpec, row_units

MAX_SHARD_BYTES = 1 << 30
"""The most bytes a shard may hold, decompressed (1 GiB; Streaming writes shards of its
``size_limit``, 64 MiB unless told otherwise). A shard is read without the dataset's
``index.json``, so nothing declares its size: a compressed shard that expands past this is
refused by name rather than allocated. The last two shards read are kept."""
_CODECS = {"zstd": "zstd", "gz": "gzip", "bz2": "bz2"}

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
    """(the shard's bytes, its sample offsets, its column config), checked (see the module
    docstring)."""
    compression = _compression(path)
    if compression is not None and compression not in _CODECS:
        package = {"br": "brotli", "snappy": "python-snappy"}[compression]
        raise DataError(f"{path}: {compression}-compressed MDS shards are not read (it would "
                        f"need {package}); write the shards with compression='zstd'")
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > MAX_SHARD_BYTES:
            raise DataError(f"{path}: larger than {MAX_SHARD_BYTES} bytes, the most an MDS shard "
                            "may hold here; write the shards with a smaller size_limit")
        data = fh.read()
    if compression is not None:
        data = decompress(data, _CODECS[compression], MAX_SHARD_BYTES, path,
                          "the most an MDS shard may hold here")
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
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{path}: the MDS column config cannot be read ({exc})") from None
    with reported_as(DataError, f"{path}: its MDS column config"):
        return data, offsets, _columns(config, len(data))


def _columns(config: Any, size: int) -> dict[str, Any]:
    """The names, encodings and sizes (None: variable) of a shard's columns, checked."""
    config = need_dict(config, "")
    for key in ("column_names", "column_encodings", "column_sizes"):
        if key not in config:
            raise StateFieldError(key, "is missing")
    names = [need_str(n, item("column_names", i))
             for i, n in enumerate(need_list(config["column_names"], "column_names"))]
    if len(set(names)) != len(names):
        raise StateFieldError("column_names", f"names a column twice ({names})")
    listed = {key: need_list(config[key], key, len(names))
              for key in ("column_encodings", "column_sizes")}
    encodings = [need_str(e, item("column_encodings", i))
                 for i, e in enumerate(listed["column_encodings"])]
    sizes = [None if n is None else need_int(n, item("column_sizes", i), 0, size)
             for i, n in enumerate(listed["column_sizes"])]
    return {"names": names, "encodings": encodings, "sizes": sizes}


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
        dims = parts[1].split(",") if len(parts) > 1 else None
        if (len(parts) <= 2 and (fixed is None or fixed in _ARRAY_DTYPES.values())
                and (dims is None or all(d.isdigit() for d in dims))):
            shape = tuple(int(d) for d in dims) if dims is not None else None
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


_VALUE_ERRORS = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, RecursionError,
                 struct.error)
"""What decoding a damaged value raises (UnicodeDecodeError and JSONDecodeError are
ValueErrors, a bad ``str_decimal`` an ArithmeticError, JSON nested too deep a
RecursionError)."""


def read(path: str, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, list[Any]], list[int]]:
    """The samples ``unit.start:unit.stop`` of one shard, column-wise; keys are sample
    indices in the shard."""
    data, offsets, config = _open(path)
    names, encodings, sizes = config["names"], config["encodings"], config["sizes"]
    if not 0 <= unit.start <= unit.stop < len(offsets):
        raise DataError(f"{display}: samples {unit.start}..{unit.stop} asked of a shard of "
                        f"{len(offsets) - 1}")
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
        position = begin + 4 * len(variable)
        if position > end:
            raise DataError(f"{display}: sample {sample} holds {end - begin} bytes, fewer than "
                            f"the sizes of its {len(variable)} variable columns: the shard is "
                            "damaged")
        lengths = list(sizes)
        found = struct.unpack_from(f"<{len(variable)}I", data, begin)
        for column, length in zip(variable, found, strict=True):
            lengths[column] = length
        if position + sum(lengths) != end:
            raise DataError(f"{display}: sample {sample} holds {end - begin} bytes, its "
                            f"columns {position + sum(lengths) - begin}: the shard is damaged")
        for column, name in enumerate(names):
            length = lengths[column]
            if name in decoders:
                try:
                    value = decoders[name](bytes(view[position:position + length]))
                except _VALUE_ERRORS as exc:
                    raise DataError(f"{display}: sample {sample}: column {name!r} "
                                    f"({encodings[column]}) cannot be decoded ({exc})") from None
                out[name].append(value)
            position += length
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
"""The format plug-in, registered by :mod:`zephon.io.formats.registry` on first use."""
