"""Damaged MDS shards and LitData chunks: every read of a damaged copy gives exactly the rows
of the undamaged file, or a DataError of ours naming the damaged file. Never a raw exception.

The damage goes where the formats keep their structure, since damage inside a text value
changes that text and no reader can tell (neither format has a checksum): truncations
anywhere, flipped bytes in headers, offset tables, column configs, frame tables and Arrow
footers, and sizes (item counts, offsets, per-item and per-column lengths) set to 0, to one
more or less than they were, and to 2**32 - 1. Compressed files are damaged inside (the
bytes decompressed, damaged and compressed again) and outside (truncated, their frame header
flipped).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard

from tests.core import litdata_sets
from zephon.errors import DataError
from zephon.io import Dataset
from zephon.io.formats import PlanHints, plan_file, read_unit

MDS = Path(__file__).resolve().parents[1] / "data" / "mds"
HINTS = PlanHints(1 << 20, 4)
SEED = 60


def rows_of_file(path: Path, fmt: str, context: str | None,
                 wanted: list[str] | None = None) -> list[dict]:
    """The rows of one file through the real reader (plan it, then read each unit), with
    the ``wanted`` fields (None: all there are)."""
    out = []
    for unit in plan_file(str(path), fmt, None, HINTS, 2, context=context):
        columns, keys = read_unit(str(path), fmt, None, unit, wanted, str(path), context)
        for r in range(len(keys)):
            out.append({name: _plain(values[r]) for name, values in columns.items()})
    return out


def _plain(value):
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


# -- where each format keeps its structure -------------------------------------------------
def _u32_table(data: bytes, at: int = 0) -> tuple[int, list[int]]:
    (count,) = struct.unpack_from("<I", data, at)
    return count, list(struct.unpack_from(f"<{count + 1}I", data, at + 4))


def mds_structure(data: bytes) -> tuple[list[tuple[int, int]], list[int]]:
    """(byte ranges holding structure, positions of uint32 sizes) of an uncompressed shard:
    the count, offsets and column config, and each sample's variable column sizes."""
    count, offsets = _u32_table(data)
    config = json.loads(data[4 + 4 * (count + 1):offsets[0]])
    variable = sum(size is None for size in config["column_sizes"])
    sizes = [0] + [4 + 4 * i for i in range(count + 1)]
    sizes += [start + 4 * v for start in offsets[:-1] for v in range(variable)]
    return [(0, offsets[0])], sizes


def litdata_structure(data: bytes, context: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """The same for a LitData chunk as stored: count and offsets and each item's leaf sizes
    (uncompressed), the prefix, offsets and frame table (``batch``), the count and offsets
    of the compressed items (``sample``), and the Arrow footer's trailer and metadata."""
    if data[:8] == b"LDFZ01\0\0":
        _, _, _, count, _, frames = struct.unpack_from("<8sHHIII", data)
        table = 24 + 4 * (count + 1)
        end = table + 24 * frames
        sizes = [12, 16, 20] + [24 + 4 * i for i in range(count + 1)]
        sizes += [table + 24 * f + k for f in range(frames) for k in (0, 4, 8, 16, 20)]
        return [(0, end)], sizes
    count, offsets = _u32_table(data)
    head = 4 + 4 * (count + 1)
    sizes = [0] + [4 + 4 * i for i in range(count + 1)]
    ranges = [(0, head)]
    if data[-8:] == b"LDARW01\0":
        (length,) = struct.unpack_from("<I", data, len(data) - 12)
        ranges.append((len(data) - 12 - min(length, 256), len(data)))
        sizes.append(len(data) - 12)
        return ranges, sizes
    if context["compression"] and context["level"] == "sample":
        return ranges, sizes
    leaves = len(context["fields"])
    sizes += [start + 4 * leaf for start in offsets[:-1] for leaf in range(leaves)]
    return ranges, sizes


def damaged(data: bytes, ranges: list[tuple[int, int]], sizes: list[int],
            rng: np.random.Generator, cases: int) -> list[tuple[bytes, str]]:
    """``cases`` damaged copies of ``data``, each with what was done to it."""
    out = []
    cuts = sorted({0, 1, 3, 4, 7, 8, 11, 12, len(data) // 2, len(data) - 12, len(data) - 8,
                   len(data) - 1} | {int(x) for x in rng.integers(0, len(data), 8)})
    out += [(data[:at], f"cut at {at}") for at in cuts if 0 <= at < len(data)]
    for _ in range(cases):
        copy = bytearray(data)
        if rng.random() < 0.5:
            start, end = ranges[int(rng.integers(0, len(ranges)))]
            at = int(rng.integers(start, end))
            copy[at] ^= int(rng.integers(1, 256))
            out.append((bytes(copy), f"flip byte {at}"))
        else:
            at = sizes[int(rng.integers(0, len(sizes)))]
            (was,) = struct.unpack_from("<I", data, at)
            value = int(rng.choice([0, was + 1, max(was - 1, 0), 2**32 - 1, was * 3 + 7]))
            struct.pack_into("<I", copy, at, value % 2**32)
            out.append((bytes(copy), f"uint32 at {at}: {was} -> {value % 2**32}"))
    return out


def recompressed(damages: list[tuple[bytes, str]]) -> list[tuple[bytes, str]]:
    return [(zstandard.ZstdCompressor().compress(d), f"{what}, compressed again")
            for d, what in damages]


def outer_damage(data: bytes, rng: np.random.Generator) -> list[tuple[bytes, str]]:
    """Truncations of a compressed file, and flips in its frame header."""
    out = [(data[:at], f"compressed file cut at {at}")
           for at in sorted({1, 4, 6, len(data) // 2, len(data) - 4, len(data) - 1})]
    for at in range(min(8, len(data))):
        copy = bytearray(data)
        copy[at] ^= int(rng.integers(1, 256))
        out.append((bytes(copy), f"compressed file: flip byte {at}"))
    return out


# -- the check -----------------------------------------------------------------------------
def check_damage(original: Path, fmt: str, context: str | None,
                 damages: list[tuple[bytes, str]], root: Path) -> dict[str, int]:
    """Read each damaged copy of ``original`` (under a name of its own, beside nothing),
    asking for the fields the original has, as a pipeline names the fields it reads: the rows
    of the original or a DataError naming the copy. Returns the outcome counts."""
    expected = rows_of_file(original, fmt, context)
    wanted = list(expected[0])
    counts = {"same": 0, "error": 0}
    for case, (data, what) in enumerate(damages):
        path = root / f"case{case}-{original.name}"
        path.write_bytes(data)
        try:
            rows = rows_of_file(path, fmt, context, wanted)
        except DataError as exc:
            assert path.name in str(exc), f"{original.name}, {what}: unnamed: {exc}"
            counts["error"] += 1
        except Exception as exc:
            raise AssertionError(f"{original.name}, {what}: {type(exc).__name__}: "
                                 f"{exc}") from None
        else:
            assert rows == expected, f"{original.name}, {what}: other rows, no error"
            counts["same"] += 1
        path.unlink()
    return counts


@pytest.mark.parametrize("variant", ["plain", "zstd"])
def test_damaged_mds_shards_are_named_or_read_exactly(variant, tmp_path):
    rng = np.random.default_rng(SEED)
    totals = {"same": 0, "error": 0}
    for shard in sorted((MDS / variant).glob("shard.*")):
        data = shard.read_bytes()
        if variant == "zstd":
            raw = zstandard.ZstdDecompressor().decompress(data)
            damages = recompressed(damaged(raw, *mds_structure(raw), rng, 40))
            damages += outer_damage(data, rng)
        else:
            damages = damaged(data, *mds_structure(data), rng, 40)
        for key, n in check_damage(shard, "mds", None, damages, tmp_path).items():
            totals[key] += n
    assert totals["error"] > 200, totals


@pytest.fixture(scope="module")
def litdata_folders(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "litdata-sets"
    folders = {variant: litdata_sets.build(root, variant) for variant in litdata_sets.VARIANTS}
    folders["chat"] = litdata_sets.build_chat(root)
    folders["text"] = litdata_sets.build_text(root)
    return folders


@pytest.mark.parametrize("variant", [*litdata_sets.VARIANTS, "chat", "text"])
def test_damaged_litdata_chunks_are_named_or_read_exactly(litdata_folders, variant, tmp_path):
    rng = np.random.default_rng(SEED)
    totals = {"same": 0, "error": 0}
    for data_file in Dataset.from_path("l", litdata_folders[variant]).files():
        chunk = Path(data_file.path)
        described = json.loads(data_file.context)
        data = chunk.read_bytes()
        if variant == "chunk":
            raw = zstandard.ZstdDecompressor().stream_reader(data).read()
            damages = recompressed(damaged(raw, *litdata_structure(raw, described), rng, 30))
            damages += outer_damage(data, rng)
        else:
            damages = damaged(data, *litdata_structure(data, described), rng, 30)
        for key, n in check_damage(chunk, "litdata", data_file.context, damages,
                                   tmp_path).items():
            totals[key] += n
    assert totals["error"] > 60, totals


@pytest.mark.parametrize("variant", ["chat", "text"])
def test_a_litdata_chunk_cut_at_its_arrow_footer_is_named(litdata_folders, variant, tmp_path):
    """LitData keeps rows of text (and of nested values) only in an Arrow footer after the
    chunk's header: a chunk cut there, or inside the footer, is an error naming it."""
    data_file = Dataset.from_path("l", litdata_folders[variant]).files()[0]
    data = Path(data_file.path).read_bytes()
    (length,) = struct.unpack_from("<I", data, len(data) - 12)
    footer = len(data) - 12 - length
    cut = tmp_path / Path(data_file.path).name
    cut.write_bytes(data[:footer])
    with pytest.raises(DataError, match=rf"{cut.name}: (holds no item bytes.*Arrow footer|"
                                        r"nested values)"):
        rows_of_file(cut, "litdata", data_file.context)
    for at in (footer + 6, footer + length // 2, len(data) - 13):
        # the trailer (length and magic) kept, the IPC file before it cut short
        cut.write_bytes(data[:at] + struct.pack("<I", at - footer) + data[-8:])
        with pytest.raises(DataError, match=rf"{cut.name}: "):
            rows_of_file(cut, "litdata", data_file.context)
