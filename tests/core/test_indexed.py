"""Megatron indexed datasets (.idx/.bin): reading, writing, units, mixing and bad files."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from zephon import Pipeline
from zephon.errors import DataError
from zephon.io import Dataset
from zephon.io.indexed import IndexedDataset, open_indexed, write_indexed_dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def corpus(n, seed, low=5, high=120, vocab=1000):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=int(rng.integers(low, high))) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64,
                                   np.uint16])
def test_every_integer_dtype_round_trips(tmp_path, dtype):
    """Documents come in the stored dtype: ``pretokenized`` checks them before its cast."""
    docs = corpus(30, 1, vocab=100)
    prefix = write_indexed_dataset(tmp_path / "d", docs, dtype=dtype)
    dataset = IndexedDataset(prefix)
    assert dataset.documents == 30 and dataset.dtype == np.dtype(dtype)
    assert all(np.array_equal(dataset.document(i), d) for i, d in enumerate(docs))
    assert dataset.document(0).dtype == np.dtype(dtype)
    assert dataset.document_lengths().tolist() == [len(d) for d in docs]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_token_files_are_refused(tmp_path, dtype):
    """A float .bin would arrive truncated (1.7, 2.2, 3.9 as 1, 2, 3): refused when opened."""
    prefix = write_indexed_dataset(tmp_path / "f", [[1.7, 2.2, 3.9], [4.0]], dtype=dtype)
    with pytest.raises(DataError, match=rf"f\.idx: token ids are stored as "
                                        rf"{np.dtype(dtype)} .*must be integers"):
        open_indexed(prefix)
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("f", prefix)])
                        ).pretokenized().batch(1, drop_last=False)
    with pytest.raises(DataError, match=r"f\.idx: token ids are stored as"):
        list(pipeline)


def test_ids_are_checked_before_the_cast_to_int32(tmp_path):
    """2**32 + 5 in an int64 .bin is an error naming the row, not the id 5."""
    prefix = write_indexed_dataset(tmp_path / "w", [[1, 2, 3], [7, 2**32 + 5, 9]],
                                   dtype=np.int64)
    source = StaticMixtureWorkSource([Dataset.from_path("w", prefix)], shuffle_rows=False)
    for vocab in (50304, None):
        pipeline = Pipeline(source).pretokenized(vocab_size=vocab).batch(1, drop_last=False)
        with pytest.raises(DataError, match=r"/w: row 1: field 'input_ids' holds token id "
                                            r"4294967301, outside \[0, (50304|2147483648)\)"):
            list(pipeline)


def test_damaged_index_entries_are_errors_naming_the_sequence(tmp_path):
    """Pointers and lengths are checked against the .bin when the index is opened, instead of
    reading another sequence's tokens or a short slice past the end of the map."""
    head = 9 + 8 + 1 + 8 + 8
    for field, value, message in [
            ("length", -4, r"x\.idx: sequence 2 is damaged .*-4 tokens"),
            ("pointer", 6, r"x\.idx: sequence 2 is damaged \(byte offset 6,"),
            ("pointer", 2**40, r"x\.idx: sequence 2 is damaged"),
            ("length", 10**6, r"x\.bin: the token file is truncated .*sequence 2 of the index")]:
        prefix = write_indexed_dataset(tmp_path / "x", corpus(5, 3), dtype=np.int32)
        raw = bytearray(Path(prefix + ".idx").read_bytes())
        if field == "length":
            struct.pack_into("<i", raw, head + 2 * 4, value)
        else:
            struct.pack_into("<q", raw, head + 5 * 4 + 2 * 8, value)
        Path(prefix + ".idx").write_bytes(bytes(raw))
        with pytest.raises(DataError, match=message):
            IndexedDataset(prefix)


def test_documents_spanning_several_sequences(tmp_path):
    """Sentence-split data: a document is the concatenation of its sequences."""
    seqs = corpus(6, 2)
    prefix = write_indexed_dataset(tmp_path / "s", seqs)
    raw = bytearray(Path(prefix + ".idx").read_bytes())
    struct.pack_into("<Q", raw, 9 + 8 + 1 + 8, 3)  # three document-index entries: 2 documents
    head = 9 + 8 + 1 + 8 + 8 + 6 * 12
    raw[head:] = np.array([0, 2, 6], np.int64).tobytes()
    Path(prefix + ".idx").write_bytes(bytes(raw))
    dataset = IndexedDataset(prefix)
    assert dataset.documents == 2
    assert np.array_equal(dataset.document(1), np.concatenate(seqs[2:]))


def test_one_pass_reads_every_document_once(tmp_path):
    docs = corpus(300, 3)
    prefix = write_indexed_dataset(tmp_path / "web_text_document", docs)
    dataset = Dataset.from_path("web", prefix)  # the prefix, as Megatron's --data-path has it
    assert [f.fmt for f in dataset.files()] == ["megatron"]
    pipeline = (Pipeline(StaticMixtureWorkSource([dataset], seed=4, arrow_unit_rows=16))
                .options(lanes=1).pretokenized().batch(1, drop_last=False))
    seen = Counter()
    for batch in pipeline:
        for record in batch.records:
            seen[record.payload["input_ids"].tobytes()] += 1
    assert seen == Counter(np.asarray(d, np.int32).tobytes() for d in docs)
    [estimate] = pipeline.estimate()
    assert estimate.tokens == sum(len(d) for d in docs)
    assert estimate.tokens_exact and estimate.documents_exact
    four_lanes = (Pipeline(StaticMixtureWorkSource([dataset], seed=4, arrow_unit_rows=16))
                  .options(lanes=4).pretokenized().batch(1, drop_last=False))
    handed = sum(len(b) for b in four_lanes)  # the last incomplete round is left over
    assert handed + four_lanes.report().leftover["documents"] == len(docs)


def test_token_shares_of_two_indexed_datasets(tmp_path):
    web = write_indexed_dataset(tmp_path / "web", corpus(3000, 5, 20, 400))
    code = write_indexed_dataset(tmp_path / "code", corpus(3000, 6, 100, 2000))
    source = StaticMixtureWorkSource(
        [Dataset.from_path("web", web), Dataset.from_path("code", code)],
        MixtureSpec({"web": 0.7, "code": 0.3}), seed=1, token_estimation=TokenEstimation(),
        repeat=True)
    pipeline = (Pipeline(source).options(lanes=2).pretokenized(eos_token_id=0)
                .pack_flat(2049).batch(8))
    tokens = Counter()
    for _, batch in zip(range(60), pipeline, strict=False):
        for record in batch.records:
            for span in record.meta["documents"]:
                tokens[span.dataset] += span.length
    share = tokens["web"] / sum(tokens.values())
    assert abs(share - 0.7) < 0.01, share


def test_document_ranges_and_found_files(tmp_path):
    docs = corpus(50, 7)
    (tmp_path / "d").mkdir()
    prefix = write_indexed_dataset(tmp_path / "d" / "part", docs)
    ranged = Dataset.from_path("r", prefix, documents=(10, 20))
    pipeline = Pipeline(StaticMixtureWorkSource([ranged])).pretokenized().batch(
        1, drop_last=False)
    got = sorted(r.payload["input_ids"].tobytes() for b in pipeline for r in b.records)
    assert got == sorted(np.asarray(d, np.int32).tobytes() for d in docs[10:20])
    found = Dataset.from_path("dir", tmp_path / "d")
    assert [f.fmt for f in found.files()] == ["megatron"]
    assert any("part.bin (tokens of" in s for s in found.skipped_files())
    assert Dataset.from_path("named", prefix + ".idx").files()[0].path == prefix
    assert Dataset.from_path("prefix", prefix).files()[0].path == prefix


def test_a_file_named_as_the_prefix_beside_it_is_not_a_second_dataset(tmp_path):
    """A stray file called ``part`` beside ``part.idx`` and ``part.bin`` listed the indexed
    dataset twice, so every document was read twice."""
    docs = corpus(12, 3)
    prefix = write_indexed_dataset(tmp_path / "part", docs)
    Path(prefix).write_text("notes")
    found = Dataset.from_path("dir", tmp_path)
    assert [(f.path, f.fmt) for f in found.files()] == [(prefix, "megatron")]
    assert f"{prefix} (not a data file)" in found.skipped_files()


def test_bad_files_are_errors_naming_them(tmp_path):
    prefix = write_indexed_dataset(tmp_path / "d", corpus(10, 8))
    data = Path(prefix + ".bin").read_bytes()
    Path(prefix + ".bin").write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"d\.bin: the token file is truncated"):
        open_indexed(prefix)
    prefix = write_indexed_dataset(tmp_path / "m", corpus(10, 8))
    raw = bytearray(Path(prefix + ".idx").read_bytes())
    Path(prefix + ".idx").write_bytes(b"NOTANIDX\x00" + bytes(raw[9:]))
    with pytest.raises(DataError, match=r"m\.idx: not a Megatron indexed dataset index"):
        open_indexed(prefix)
    raw[9:17] = struct.pack("<Q", 2)
    Path(prefix + ".idx").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"m\.idx: index version 2 is not supported"):
        open_indexed(prefix)
    from zephon.io.formats import PlanHints, read_unit

    good = write_indexed_dataset(tmp_path / "g", corpus(5, 8))
    [(_, unit)] = Dataset.from_path("g", good).plan(PlanHints(1, 8), 1)
    with pytest.raises(DataError, match=r"g\.idx: missing field 'text'"):
        read_unit(good, "megatron", None, unit, ["text"], "g.idx")


def test_megatron_core_reads_ours_and_we_read_theirs(tmp_path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    docs = corpus(40, 9)
    ours = write_indexed_dataset(tmp_path / "ours", docs, dtype=np.uint16)
    theirs_reader = indexed.IndexedDataset(ours)
    assert len(theirs_reader) == 40
    assert all(np.array_equal(theirs_reader[i], d) for i, d in enumerate(docs))
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=np.int32)
    import torch

    for d in docs:
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(str(tmp_path / "theirs.idx"))
    mine = IndexedDataset(str(tmp_path / "theirs"))
    assert mine.documents == 40
    assert all(np.array_equal(mine.document(i), d) for i, d in enumerate(docs))
