"""``pretokenized``: token-id columns give the tokens the text route gives, and bad ids fail
naming file and row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl
from tests.kit.elastic import merged_state
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.io.formats import ListColumn
from zephon.ops.base import BuildContext
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.records import Doc
from zephon.text.tokenizer import load_tokenizer
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

LANES = 4


@pytest.fixture
def same_corpus(tmp_path, tokenizer_dir):
    """The same documents as text and as token ids (no BOS/EOS), in identical file layouts."""
    tokenizer = load_tokenizer(tokenizer_dir)
    sets = {"a": make_documents(90, seed=21, min_words=5, max_words=80),
            "b": make_documents(40, seed=22, min_words=60, max_words=200)}
    for name, texts in sets.items():
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        for kind in ("text", "ids"):
            (tmp_path / kind / name).mkdir(parents=True)
        for i in range(2):
            rows = slice(i, None, 2)
            pq.write_table(pa.table({"text": texts[rows]}),
                           tmp_path / "text" / name / f"{i}.parquet", row_group_size=9)
            pq.write_table(pa.table({"input_ids": pa.array(ids[rows], pa.list_(pa.int32()))}),
                           tmp_path / "ids" / name / f"{i}.parquet", row_group_size=9)
    return tmp_path, tokenizer


def build(root, kind, tokenizer, tokenizer_dir, world=1, rank=0):
    source = StaticMixtureWorkSource(
        [Dataset.from_path("a", root / kind / "a"), Dataset.from_path("b", root / kind / "b")],
        MixtureSpec({"a": 0.7, "b": 0.3}), seed=5, token_estimation=TokenEstimation(),
        repeat=True)
    pipeline = Pipeline(source).options(lanes=LANES, dp_rank=rank, dp_world_size=world,
                                        prefetch=0)
    if kind == "text":
        pipeline = pipeline.tokenize(tokenizer_id=tokenizer_dir)
    else:
        pipeline = pipeline.pretokenized(bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id,
                                         vocab_size=len(tokenizer))
    return pipeline.pack_flat(65, "wrap").shuffle(4).batch(2)


def tensors(batch):
    out = batch.to_training(return_labels=True, return_cu_seqlens=True, flatten=True)
    return {k: v.numpy().tobytes() for k, v in out.items()}


def test_token_columns_equal_the_text_route(same_corpus, tokenizer_dir):
    root, tokenizer = same_corpus
    text = [tensors(b) for _, b in zip(range(20), build(root, "text", tokenizer,
                                                         tokenizer_dir), strict=False)]
    ids = [tensors(b) for _, b in zip(range(20), build(root, "ids", tokenizer, tokenizer_dir),
                                      strict=False)]
    assert len(text) == 20 and text == ids


def test_resume_at_another_world_size_matches_the_text_route(same_corpus, tokenizer_dir):
    root, tokenizer = same_corpus
    reference = [tensors(b) for _, b in zip(range(12), build(root, "text", tokenizer,
                                                             tokenizer_dir), strict=False)]
    ranks = [build(root, "ids", tokenizer, tokenizer_dir, 2, r) for r in range(2)]
    iterators = [iter(p) for p in ranks]
    got = {}
    for _ in range(2):
        for iterator in iterators:
            batch = next(iterator)
            got[batch.index * LANES + batch.lane] = tensors(batch)
    state = merged_state(ranks)
    resumed = build(root, "ids", tokenizer, tokenizer_dir, 1, 0)
    resumed.load_state_dict(state)
    for m, batch in zip(range(4, 12), resumed, strict=False):
        got[batch.index * LANES + batch.lane] = tensors(batch)
        assert batch.index * LANES + batch.lane == m
    assert [got[m] for m in range(12)] == reference


def test_list_columns_are_numpy_views():
    column = ListColumn(pa.array([[1, 2], None, [], [7]], pa.list_(pa.int64())))
    assert isinstance(column[0], np.ndarray) and column[0].tolist() == [1, 2]
    assert column[1] is None and column[2].size == 0 and len(column) == 4


def test_bad_ids_name_file_and_row(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [1, 2]}, {"input_ids": ["a", "b"]}])
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", tmp_path / "d.jsonl")])
                        ).pretokenized().batch(1)
    with pytest.raises(DataError, match=r"d\.jsonl:2: field 'input_ids' is a list of str, "
                                        "expected a list of token ids"):
        list(pipeline)
    pq.write_table(pa.table({"input_ids": [[1, 2], [3, 99]]}), tmp_path / "v.parquet")
    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("v", tmp_path /
                                                                    "v.parquet")],
                                                 shuffle_rows=False))
                .pretokenized(vocab_size=50).batch(1))
    with pytest.raises(DataError, match=r"v\.parquet: row 1: field 'input_ids' holds token id "
                                        r"99, outside \[0, 50\)"):
        list(pipeline)
    pq.write_table(pa.table({"input_ids": ["x", "y"]}), tmp_path / "s.parquet")
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("s", tmp_path /
                                                                   "s.parquet")])
                        ).pretokenized().batch(1)
    with pytest.raises(DataError, match=r"s\.parquet: row \d: field 'input_ids' is str"):
        list(pipeline)


def test_special_ids_and_options():
    op = PretokenizedSpec(bos_token_id=1, eos_token_id=2, max_document_tokens=3).build(
        BuildContext(seed=0, lanes=1))
    [pieces] = op.apply([Doc(None, "d", "x", fields={"input_ids": np.array([5, 6, 7, 8])})],
                        ["here"])
    assert [p.tokens.tolist() for p in pieces] == [[1, 5, 6], [7, 8, 2]]
    assert [p.doc_start for p in pieces] == [0, 3]
    [empty] = op.apply([Doc(None, "d", "x", fields={"input_ids": []})], ["here"])
    assert empty.reason == "empty"
    with pytest.raises(ConfigError, match="eos_token_id=9 is not below vocab_size=5"):
        PretokenizedSpec(eos_token_id=9, vocab_size=5)


def _apply(spec, ids):
    op = spec.build(BuildContext(seed=0, lanes=1))
    return op.apply([Doc(None, "d", "x", fields={"input_ids": ids})], ["d.jsonl:3"])


@pytest.mark.parametrize("ids, bad", [
    (np.array([1, 2**32 + 5]), 2**32 + 5), (np.array([2**31, 4]), 2**31),
    (np.array([3, 2**33 + 7], np.uint64), 2**33 + 7), ([5, 2**31], 2**31),
    (np.array([-1, 2], np.int8), -1)])
def test_ids_must_fit_int32_without_a_vocabulary(ids, bad):
    """Without vocab_size the cast to int32 wrapped ids around (2**32 + 5 arrived as 5)."""
    with pytest.raises(DataError, match=rf"d\.jsonl:3: field 'input_ids' holds token id {bad}, "
                                        r"outside \[0, 2147483648\) \(no vocab_size"):
        _apply(PretokenizedSpec(), ids)
    [[piece]] = _apply(PretokenizedSpec(), np.array([0, 2**31 - 1], np.uint64))
    assert piece.tokens.dtype == np.int32 and piece.tokens.tolist() == [0, 2**31 - 1]


def test_wide_ids_in_files_name_file_and_row(tmp_path):
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], [3, 2**33 + 7]],
                                                   pa.list_(pa.uint64()))}),
                   tmp_path / "u.parquet")
    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("u", tmp_path /
                                                                    "u.parquet")],
                                                 shuffle_rows=False))
                .pretokenized().batch(1))
    with pytest.raises(DataError, match=r"u\.parquet: row 1: field 'input_ids' holds token id "
                                        r"8589934599, outside \[0, 2147483648\)"):
        list(pipeline)
    for huge in (2**64, 2**70, -2**64):
        (tmp_path / "j.jsonl").write_text(f'{{"input_ids": [1]}}\n{{"input_ids": [2, {huge}]}}\n')
        pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("j", tmp_path /
                                                                       "j.jsonl")])
                            ).pretokenized(vocab_size=50304).batch(1)
        with pytest.raises(DataError, match=rf"j\.jsonl:2: field 'input_ids' holds token id "
                                            rf"{huge}, outside \[0, 50304\)"):
            list(pipeline)


def test_special_ids_and_vocabulary_must_fit_int32():
    with pytest.raises(ConfigError, match=r"vocab_size=2147483649 does not fit the int32"):
        PretokenizedSpec(vocab_size=2**31 + 1)
    with pytest.raises(ConfigError, match=r"eos_token_id must be a non-negative int below 2\*\*31"):
        PretokenizedSpec(eos_token_id=2**31)
    [[piece]] = _apply(PretokenizedSpec(vocab_size=2**31), np.array([2**31 - 1]))
    assert piece.tokens.tolist() == [2**31 - 1]
