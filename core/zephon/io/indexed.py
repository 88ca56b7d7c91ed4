"""Megatron indexed datasets: ``prefix.idx`` (the index) and ``prefix.bin`` (the tokens).

The format, as Megatron's ``preprocess_data.py`` writes it (little-endian):

``prefix.idx``
    ``b"MMIDIDX\\x00\\x00"`` (9 bytes), version ``u64`` = 1, dtype code ``u8``, sequence count
    ``S`` (``u64``), document-index count ``D + 1`` (``u64``), then ``int32[S]`` sequence
    lengths in tokens, ``int64[S]`` sequence byte offsets into the ``.bin``, ``int64[D + 1]``
    the sequence at which each document starts (the last entry is ``S``), and for multimodal
    data ``int8[S]`` sequence modes (ignored here).
``prefix.bin``
    the sequences' tokens back to back, in the dtype of the code: 1 uint8, 2 int8, 3 int16,
    4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.

A Zephon document is a document of the index: the tokens of its sequences in order (one
sequence per document for GPT data; several when the data was split into sentences). The index
is read whole (16 bytes per sequence) and the ``.bin`` is memory-mapped, so a one-sequence
document costs one slice (a read-only view of the map, in the stored dtype) and only the pages
read are loaded. Ids reach their reader in the stored dtype, so that ``pretokenized`` checks
them before its one cast to int32: a cast first would wrap 2**32 + 5 around to 5.

The index is checked when it is opened, with a few vectorized passes over its arrays (a
fraction of what reading the index costs; measured: docs/measurements.md): every sequence
must lie inside the ``.bin`` at a whole multiple of the dtype's size, with a length that is
not negative. Token ids must be integers: the float codes (6, 7) are refused when the index
is opened, since Megatron writes token ids as integers (uint16, or int32 above 65,500 ids)
and a float id has no one right integer.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES: dict[int, type[np.number]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32,
                                      5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8


def prefix_of(path: str) -> str | None:
    """The dataset prefix when ``path`` names one (``prefix``, ``prefix.idx`` or
    ``prefix.bin`` with both files present), else None."""
    base = path[:-4] if path.endswith((".idx", ".bin")) else path
    if os.path.isfile(base + ".idx") and os.path.exists(base + ".bin"):
        return base
    return None


class IndexedDataset:
    """A read-only view of one indexed dataset; see the module docstring."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        idx, binary = prefix + ".idx", prefix + ".bin"
        try:
            raw = Path(idx).read_bytes()
        except OSError as exc:
            raise DataError(f"{idx}: cannot read the index ({exc.strerror})") from None
        if raw[:len(MAGIC)] != MAGIC:
            raise DataError(f"{idx}: not a Megatron indexed dataset index (its first bytes are "
                            f"{raw[:len(MAGIC)]!r}, expected {MAGIC!r})")
        if len(raw) < _HEADER:
            raise DataError(f"{idx}: the index is truncated ({len(raw)} bytes)")
        version, code, sequences, doc_entries = struct.unpack_from("<QBQQ", raw, len(MAGIC))
        if version != VERSION:
            raise DataError(f"{idx}: index version {version} is not supported (only {VERSION})")
        if code not in DTYPES:
            raise DataError(f"{idx}: unknown dtype code {code} (known: {sorted(DTYPES)})")
        self.dtype = np.dtype(DTYPES[code])
        if self.dtype.kind == "f":
            raise DataError(f"{idx}: token ids are stored as {self.dtype} (dtype code {code}); "
                            "token ids must be integers: write the dataset with an integer "
                            "dtype (Megatron uses uint16 or int32)")
        need = _HEADER + sequences * 12 + doc_entries * 8
        if len(raw) < need:
            raise DataError(f"{idx}: the index is truncated ({len(raw)} bytes, its header "
                            f"announces {need})")
        offset = _HEADER
        self.lengths = np.frombuffer(raw, np.int32, sequences, offset)
        offset += sequences * 4
        self.pointers = np.frombuffer(raw, np.int64, sequences, offset)
        offset += sequences * 8
        self.doc_index = np.frombuffer(raw, np.int64, doc_entries, offset)
        if doc_entries == 0 or self.doc_index[0] != 0 or self.doc_index[-1] != sequences or \
                np.any(np.diff(self.doc_index) < 0):
            raise DataError(f"{idx}: the document index is not a rising list from 0 to the "
                            f"{sequences} sequences")
        try:
            size = os.path.getsize(binary)
        except OSError as exc:
            raise DataError(f"{binary}: cannot read the token file ({exc.strerror})") from None
        _check_sequences(idx, binary, self.lengths, self.pointers, self.dtype.itemsize, size)
        # A plain ndarray view of the map: slices of a np.memmap pay for a subclass each.
        self.tokens: Any = (np.memmap(binary, self.dtype, mode="r", shape=(
            size // self.dtype.itemsize,)).view(np.ndarray)
            if size >= self.dtype.itemsize else np.zeros(0, self.dtype))
        self.starts = self.pointers // self.dtype.itemsize

    @property
    def documents(self) -> int:
        return len(self.doc_index) - 1

    def document_lengths(self) -> np.ndarray:
        """Tokens per document (int64)."""
        totals = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        return totals[self.doc_index[1:]] - totals[self.doc_index[:-1]]

    def document(self, i: int) -> np.ndarray:
        """Document ``i``'s tokens in the stored dtype: a read-only view of the map for one
        sequence, a fresh array for several."""
        first, last = int(self.doc_index[i]), int(self.doc_index[i + 1])
        if last - first == 1:
            start = int(self.starts[first])
            return self.tokens[start:start + int(self.lengths[first])]
        parts = [self.tokens[int(self.starts[s]):int(self.starts[s]) + int(self.lengths[s])]
                 for s in range(first, last)]
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)


def _check_sequences(idx: str, binary: str, lengths: np.ndarray, pointers: np.ndarray,
                     itemsize: int, size: int) -> None:
    """Raise a DataError naming the first sequence that does not lie inside the ``.bin`` of
    ``size`` bytes: a negative length, a pointer that is negative or not a multiple of
    ``itemsize``, or tokens past the end (a truncated or damaged file).

    Whole-array reductions (min, max, one OR of the pointers, the max of the ends); the
    per-sequence masks that find the culprit run only on the error path."""
    if not lengths.size:
        return
    if lengths.min() >= 0 and pointers.min() >= 0 and pointers.max() <= size and \
            not int(np.bitwise_or.reduce(pointers)) & (itemsize - 1) and \
            (pointers + np.multiply(lengths, itemsize, dtype=np.int64)).max() <= size:
        return
    damaged = (lengths < 0) | (pointers < 0) | (pointers > size) | (pointers % itemsize != 0)
    past = ~damaged & (np.multiply(lengths, itemsize, dtype=np.int64) > size - pointers)
    s = int(np.argmax(damaged | past))
    pointer, length = int(pointers[s]), int(lengths[s])
    if damaged[s]:
        raise DataError(f"{idx}: sequence {s} is damaged (byte offset {pointer}, {length} "
                        f"tokens of {itemsize} bytes, in a token file of {size} bytes)")
    raise DataError(f"{binary}: the token file is truncated ({size} bytes; sequence {s} of the "
                    f"index needs {pointer + length * itemsize})")


@functools.lru_cache(maxsize=64)
def _open(prefix: str, stamp: tuple[int, int, int]) -> IndexedDataset:
    return IndexedDataset(prefix)


def open_indexed(prefix: str) -> IndexedDataset:
    """The dataset at ``prefix``, parsed once per process while its files are unchanged."""
    try:
        idx, binary = os.stat(prefix + ".idx"), os.stat(prefix + ".bin")
    except OSError as exc:
        raise DataError(f"{prefix}: not a Megatron indexed dataset ({exc.strerror}: "
                        f"{exc.filename})") from None
    return _open(prefix, (idx.st_mtime_ns, idx.st_size, binary.st_size))


class DocumentColumn:
    """Documents ``start .. stop`` of an indexed dataset as a column: ``column[r]`` is document
    ``start + r`` in the stored dtype, read from the memory map when asked for."""

    def __init__(self, dataset: IndexedDataset, start: int, stop: int):
        self.dataset, self.start, self.stop = dataset, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, r: int) -> np.ndarray:
        return self.dataset.document(self.start + r)


def write_indexed_dataset(prefix: str | os.PathLike[str], documents: Iterable[Any],
                          dtype: Any = np.int32) -> str:
    """Write ``documents`` (sequences of token ids) as ``prefix.idx`` / ``prefix.bin``, one
    sequence per document, as ``preprocess_data.py`` does; returns the prefix. For tests and
    for converting small corpora; ids must fit ``dtype``."""
    dtype = np.dtype(dtype)
    code = next((c for c, t in DTYPES.items() if np.dtype(t) == dtype), None)
    if code is None:
        raise ValueError(f"dtype {dtype} has no code in the indexed dataset format")
    prefix = os.fspath(prefix)
    lengths: list[int] = []
    with open(prefix + ".bin", "wb") as out:
        for doc in documents:
            array = np.asarray(doc)
            if array.size and dtype.kind in "iu":
                info = np.iinfo(dtype)
                if array.min() < info.min or array.max() > info.max:
                    raise ValueError(f"token ids {array.min()}..{array.max()} do not fit "
                                     f"{dtype}")
            out.write(array.astype(dtype).tobytes())
            lengths.append(array.size)
    sizes = np.array(lengths, dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]) * dtype.itemsize \
        if lengths else np.zeros(0, np.int64)
    with open(prefix + ".idx", "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<QBQQ", VERSION, code, len(lengths), len(lengths) + 1))
        out.write(sizes.tobytes())
        out.write(pointers.astype(np.int64).tobytes())
        out.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
    return prefix
