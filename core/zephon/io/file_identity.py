"""What identifies a local file's content: its size and a digest of bytes sampled across it,
read in the one open that lists the file.

Ranks compare listings, resumes compare checkpoints with the files, and a reader compares a
file with its listing before reading it; each reads the same bytes of a file of a given size,
since where it reads follows from the size alone:

- the last :data:`TAIL_BYTES` (4 KiB), which for Parquet hold the footer the listing parses
  from the same read;
- :data:`SAMPLED_BLOCKS` blocks of :data:`BLOCK_BYTES` spread evenly over the rest, the first
  at offset 0 and the last ending where the tail starts; where the rest is no longer than
  the blocks together, the rest whole.

A file's version is the digest of its tail (16 hex digits of SHA-1) when the tail is the
whole file, else that and a digest of the tail and the blocks together, joined by ``-`` (so
a change can be told to be in the tail or before it). Modification times are
left out: two nodes holding the same bytes have different ones, and a copy keeps its bytes.

Limits. The version changes when a same-size edit changes a byte of the tail or of a sampled
block: always when the edit is a run longer than :func:`largest_gap` (a quarter of what lies
before the tail), or covers the first bytes, the middle or the end of the file, and for other
short runs only where they touch a block. Lines reordered at the start of a file and a
rewritten row group across its middle are caught; one flipped byte between two blocks of a
large file is not. Files of up to 5 KiB and a quarter (the tail and the blocks together) are
read whole.

Cost: a ``pread`` a block but the last (read with the tail, which it touches), the listing's
largest cost after opening the file, so five blocks and no more (``python -m
benchmarks.listing`` prints the listing's cost a file against another revision). On a
network filesystem each block may cost a round trip, which makes the listing threaded there
(:data:`zephon.io.dataset.SLOW_FILE_S`).
"""

from __future__ import annotations

import hashlib
import itertools
import os

TAIL_BYTES = 4096
"""Bytes read from a file's end: the version's tail, and a Parquet file's footer."""
SAMPLED_BLOCKS = 5
"""Blocks read before the tail of a file larger than the tail."""
BLOCK_BYTES = 256
"""Bytes in each sampled block."""
SCHEME = (f"size, last {TAIL_BYTES // 1024} KiB and {SAMPLED_BLOCKS} blocks of {BLOCK_BYTES} "
          "bytes")
"""How versions are made, in words: part of a dataset's fingerprint, so a checkpoint written
when versions were made otherwise is refused saying so, not as a change of every file."""


def sampled_ranges(size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the blocks a file of ``size`` bytes is sampled at, before its
    tail; none when the tail is the whole file."""
    rest = size - TAIL_BYTES
    if rest <= 0:
        return []
    if rest <= SAMPLED_BLOCKS * BLOCK_BYTES:
        return [(0, rest)]
    last = rest - BLOCK_BYTES
    return [(i * last // (SAMPLED_BLOCKS - 1), BLOCK_BYTES) for i in range(SAMPLED_BLOCKS)]


def largest_gap(size: int) -> int:
    """The longest run of bytes before the tail that no sampled block touches."""
    ranges = sampled_ranges(size)
    return max((b[0] - a[0] - a[1] for a, b in itertools.pairwise(ranges)),
               default=0)


def read_sampled(fd: int, size: int) -> tuple[bytes, bytes]:
    """(the tail, the sampled blocks joined) of the open file ``fd`` of ``size`` bytes. The
    last block ends where the tail starts, so one read gives both; a file no longer than the
    tail and the blocks together is one read."""
    rest = size - TAIL_BYTES
    if rest <= SAMPLED_BLOCKS * BLOCK_BYTES:
        if rest <= 0:
            return os.pread(fd, TAIL_BYTES, 0), b""
        whole = os.pread(fd, size, 0)
        return whole[rest:], whole[:rest]
    last = rest - BLOCK_BYTES
    end = os.pread(fd, BLOCK_BYTES + TAIL_BYTES, last)
    blocks = [os.pread(fd, BLOCK_BYTES, i * last // (SAMPLED_BLOCKS - 1))
              for i in range(SAMPLED_BLOCKS - 1)]
    blocks.append(end[:BLOCK_BYTES])
    return end[BLOCK_BYTES:], b"".join(blocks)


def read_identity(path: str) -> tuple[int, bytes, bytes]:
    """(size, tail, sampled blocks) of the file at ``path``, from one open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return (size, *read_sampled(fd, size))
    finally:
        os.close(fd)


def version_of(tail: bytes, sampled: bytes) -> str:
    """The version a file's tail and sampled blocks give (see the module docstring)."""
    digest = hashlib.sha1(tail, usedforsecurity=False)
    head = digest.hexdigest()[:16]
    if not sampled:
        return head
    digest.update(sampled)
    return f"{head}-{digest.hexdigest()[:16]}"


def file_version(path: str) -> tuple[int, str]:
    """(size, version) of the file at ``path``."""
    size, tail, sampled = read_identity(path)
    return size, version_of(tail, sampled)


def paths_version(paths: tuple[str, ...]) -> tuple[int, str]:
    """(size, version) of a file kept as several (a Megatron ``.idx`` and ``.bin``): their
    sizes added, and one version of their versions."""
    if len(paths) == 1:
        return file_version(paths[0])
    sizes, versions = zip(*(file_version(p) for p in paths), strict=True)
    joined = "+".join(versions).encode()
    return sum(sizes), hashlib.sha1(joined, usedforsecurity=False).hexdigest()[:16]


def what_differs(listed: str, now: str) -> str:
    """How a file whose version went from ``listed`` to ``now`` changed, in words."""
    if listed.partition("-")[0] != now.partition("-")[0]:
        return f"its last {TAIL_BYTES // 1024} KiB differ from when it was listed"
    return (f"its bytes before its last {TAIL_BYTES // 1024} KiB differ from when it was "
            f"listed (at the {SAMPLED_BLOCKS} places sampled across it)")
