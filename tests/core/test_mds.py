"""Mosaic Streaming's MDS shards (tests/data/mds, written by Streaming's own MDSWriter, see
make_mds.py there) read as a dataset: every column as written, the same documents and
tokens as the same rows in JSON Lines, compressed or not, resumed exactly, and from an
object store through a registered scheme."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from tests.hub.hubdata import fast_options
from tests.kit.batches import assert_resumes_exactly
from tests.kit.buckets import BUCKETS, MemoryBucket
from tests.kit.mds import (
    EXPECTED,
    MDS,
    pipeline_over,
    refused_peak,
    rows_of,
    sorted_documents,
    token_rows,
    zstd_bomb,
)
from zephon.errors import DataError
from zephon.io import Dataset, storage


@pytest.mark.parametrize("variant", ["plain", "zstd"])
def test_every_column_reads_as_streaming_wrote_it(variant):
    dataset = Dataset.from_path("m", MDS / variant)
    assert {f.fmt for f in dataset.files()} == {"mds"} and len(dataset.files()) >= 4
    assert dataset.skipped_files() == (
        f"{MDS / variant / 'index.json'} (metadata of the mds files beside it)",)
    rows = rows_of(dataset)
    assert [r["id"] for r in rows] == [e["id"] for e in EXPECTED]
    for got, want in zip(rows, EXPECTED, strict=True):
        assert got["text"] == want["text"] and got["meta"] == want["meta"]
        assert got["tokens"].tolist() == want["tokens"] and str(got["tokens"].dtype) == "int32"
        assert got["raw"] == bytes.fromhex(want["raw"])
        assert got["score"] == pytest.approx(want["score"], abs=1e-6)


def test_mds_gives_the_documents_of_the_same_rows_in_json_lines(tokenizer_dir, tmp_path):
    assert token_rows(pipeline_over(MDS / "plain", tokenizer_dir)) == token_rows(
        pipeline_over(MDS / "zstd", tokenizer_dir))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps({"text": e["text"]}) + "\n" for e in EXPECTED))

    from_mds = sorted_documents(MDS / "plain", tokenizer_dir)
    assert len(from_mds) == len(EXPECTED) and from_mds == sorted_documents(jsonl, tokenizer_dir)


def test_mds_resumes_exactly_and_reads_from_an_object_store(tokenizer_dir, tmp_path):
    reference = token_rows(pipeline_over(MDS / "zstd", tokenizer_dir))
    assert_resumes_exactly(lambda: pipeline_over(MDS / "zstd", tokenizer_dir), stops=(1, 3, 5))
    storage.register_scheme("mem", storage.Scheme(MemoryBucket))
    try:
        BUCKETS["mds"] = {f"train/{p.name}": p.read_bytes()
                          for p in sorted((MDS / "zstd").iterdir())}
        remote = pipeline_over("mem://mds/train/", tokenizer_dir,
                               io_options=fast_options(tmp_path / "cache"))
        assert token_rows(remote) == reference
        assert remote.loader().source.datasets[0].skipped_files() == (
            "mem://mds/train/index.json (metadata of the mds files beside it)",)
    finally:
        storage.unregister_scheme("mem")
        BUCKETS.clear()


def test_damaged_and_unreadable_shards_are_named(tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(MDS / "plain", folder)
    shard = folder / "shard.00001.mds"
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[:-7]))  # cut short: the offsets no longer fit
    with pytest.raises(DataError, match=r"shard\.00001\.mds: not an MDS shard \(its sample "
                                        r"offsets do not fit"):
        rows_of(Dataset.from_path("m", folder))
    (folder / "shard.00001.mds").unlink()
    (folder / "shard.00002.mds.br").write_bytes(b"x" * 10)
    with pytest.raises(DataError, match="br-compressed MDS shards are not read"):
        rows_of(Dataset.from_path("m", folder))


def _with_config(data: bytes, edit) -> bytes:
    """An uncompressed shard with its column config edited (its offsets moved to fit)."""
    count = struct.unpack_from("<I", data)[0]
    offsets = struct.unpack_from(f"<{count + 1}I", data, 4)
    head = 4 + 4 * (count + 1)
    config = json.loads(data[head:offsets[0]])
    edit(config)
    text = json.dumps(config).encode()
    moved = [o - offsets[0] + head + len(text) for o in offsets]
    return struct.pack(f"<I{count + 1}I", count, *moved) + text + data[offsets[0]:]


def _sample_column(data: bytes, sample: int, column: str) -> int:
    """Where ``column``'s bytes of ``sample`` start in an uncompressed shard."""
    count = struct.unpack_from("<I", data)[0]
    offsets = struct.unpack_from(f"<{count + 1}I", data, 4)
    config = json.loads(data[4 + 4 * (count + 1):offsets[0]])
    sizes = list(config["column_sizes"])
    variable = [i for i, s in enumerate(sizes) if s is None]
    for i, n in zip(variable, struct.unpack_from(f"<{len(variable)}I", data, offsets[sample]),
                    strict=True):
        sizes[i] = n
    index = config["column_names"].index(column)
    return offsets[sample] + 4 * len(variable) + sum(sizes[:index])


def _set_byte(at_column: str, value: int):
    def damage(data: bytes) -> bytes:
        out = bytearray(data)
        out[_sample_column(data, 2, at_column)] = value
        return bytes(out)
    return damage


@pytest.mark.parametrize("damage, message", [
    (lambda d: _with_config(d, lambda c: c["column_encodings"].pop()),
     r"its MDS column config: column_encodings has 5 item\(s\), must have 6"),
    (lambda d: _with_config(d, lambda c: c.pop("column_sizes")),
     "its MDS column config: column_sizes is missing"),
    (lambda d: _with_config(d, lambda c: c["column_sizes"].__setitem__(0, -1)),
     r"its MDS column config: column_sizes\[0\] is -1, must be >= 0"),
    (lambda d: _with_config(d, lambda c: c.__setitem__("column_names", "text")),
     r"its MDS column config: column_names is 'text' \(str\), must be a list"),
    (lambda d: _with_config(d, lambda c: c["column_encodings"].__setitem__(
        5, "ndarray:int32:2,x")), "column 'tokens' has the unknown MDS encoding"),
    (_set_byte("text", 0xFF), r"sample 2: column 'text' \(str\) cannot be decoded"),
    (_set_byte("meta", ord("#")), r"sample 2: column 'meta' \(json\) cannot be decoded"),
    (_set_byte("tokens", 0xFF), r"sample 2: column 'tokens' \(ndarray:int32\) cannot be "
                                "decoded"),
    (lambda d: _with_config(d, lambda c: c["column_sizes"].__setitem__(0, 9)),
     r"sample 0 holds \d+ bytes, its columns \d+: the shard is damaged"),
])
def test_each_kind_of_damaged_shard_is_named_with_its_sample(tmp_path, damage, message):
    """Each gave a raw ValueError, KeyError, JSONDecodeError or IndexError naming nothing."""
    folder = tmp_path / "bad"
    shutil.copytree(MDS / "plain", folder)
    shard = folder / "shard.00001.mds"
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(DataError, match=rf"shard\.00001\.mds: .*{message}"):
        rows_of(Dataset.from_path("m", folder))


def test_a_shard_decompresses_no_further_than_the_cap(tmp_path, monkeypatch):
    """A 32 KB .mds.zstd shard expanded to 2.2 GB: decompression stops one byte past
    MAX_SHARD_BYTES, having allocated no more."""
    from zephon.io.formats import mds

    bomb = zstd_bomb(64 << 20)
    assert len(bomb) < 32 << 10
    folder = tmp_path / "bomb"
    shutil.copytree(MDS / "zstd", folder)
    (folder / "shard.00002.mds.zstd").write_bytes(bomb)
    monkeypatch.setattr(mds, "MAX_SHARD_BYTES", 4 << 20)
    peak = refused_peak(lambda: rows_of(Dataset.from_path("m", folder)),
                        r"shard\.00002\.mds\.zstd: decompresses to more than 4194304 bytes, "
                        "the most an MDS shard")
    assert peak < 16 << 20
