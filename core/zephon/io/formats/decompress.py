"""Decompression whose output is bounded before it is made.

A compressed file says nothing trustworthy about its size: a 32 KB zstd frame of zeros
expands to 2 GB, a gzip member to a thousand times its size. Readers of peer formats (MDS
shards, LitData chunks) decompress a whole file or item at once, so each call here is given
the most bytes the result may hold (what the format's index declares, or a format's
documented cap) and reads at most one byte more than that: past the bound the file is
refused by name, and no more than the bound was ever allocated.

A damaged or truncated stream is a :class:`~zephon.errors.DataError` naming the file (gzip
and bzip2 streams must end; a zstd stream cut short yields what it held, which the format's
own checks then refuse). Concatenated frames (zstd) and members (gzip, bzip2) are read one
after another, as ``zstandard``'s ``read()``, ``gzip.decompress`` and ``bz2.decompress`` do.
"""

from __future__ import annotations

import bz2
import zlib
from typing import Any

from zephon.errors import DataError

_STEP = 1 << 24
"""Bytes asked of a decompressor at a time (16 MiB), so that output grows in pieces."""


def decompress(data: bytes | memoryview, codec: str, limit: int, display: str,
               bound: str) -> bytes:
    """``data`` decompressed with ``codec`` (``"zstd"``, ``"gzip"`` or ``"bz2"``), which may
    hold at most ``limit`` bytes; ``bound`` says where the limit comes from in the error
    (``"the 1004 bytes its index declares"``). ``display`` names the file."""
    errors: tuple[type[BaseException], ...] = (zlib.error, OSError, EOFError)
    try:
        if codec == "zstd":
            import zstandard

            errors += (zstandard.ZstdError,)
            parts = _zstd(data, limit)
        elif codec in ("gzip", "bz2"):
            parts = _members(data, codec, limit, display)
        else:
            raise ValueError(f"unknown codec {codec!r}")
    except _TooLarge:
        raise DataError(f"{display}: decompresses to more than {limit} bytes, {bound}: a "
                        "damaged file, or a compression bomb; it is not read") from None
    except errors as exc:
        raise DataError(f"{display}: damaged {codec} data ({exc})") from None
    return b"".join(parts)


class _TooLarge(Exception):
    pass


def _zstd(data: bytes | memoryview, limit: int) -> list[bytes]:
    import zstandard

    parts, total = [], 0
    with zstandard.ZstdDecompressor().stream_reader(bytes(data),
                                                    read_across_frames=True) as reader:
        while True:
            part = reader.read(min(limit + 1 - total, _STEP))
            if not part:
                return parts
            parts.append(part)
            total += len(part)
            if total > limit:
                raise _TooLarge


def _members(data: bytes | memoryview, codec: str, limit: int, display: str) -> list[bytes]:
    """The members of a gzip or bzip2 stream, one decompressor each, each asked for no more
    than what the limit leaves."""
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    while rest:
        decompressor: Any = (zlib.decompressobj(wbits=31) if codec == "gzip"
                             else bz2.BZ2Decompressor())
        pending = rest
        while True:
            part = decompressor.decompress(pending, limit + 1 - total)
            parts.append(part)
            total += len(part)
            if total > limit:
                raise _TooLarge
            if decompressor.eof:
                break
            pending = (decompressor.unconsumed_tail if codec == "gzip" else b"")
            if not pending and (codec == "gzip" or decompressor.needs_input):
                raise DataError(f"{display}: {codec} data cut short (the stream does not "
                                "end)")
        rest = decompressor.unused_data
    return parts
