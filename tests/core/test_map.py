"""``map``: user functions on documents, before or after tokenization."""

from __future__ import annotations

import pickle

import pytest

from tests.conftest import write_jsonl
from tests.core.toy_ops import first_ten_tokens, not_a_dict, shout_text
from tests.kit.elastic import digest, merged_state, run, stream
from zephon import Pipeline, StateMismatchError
from zephon.demo.assets import make_documents
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.recipe import DataRecipe
from zephon.work import StaticMixtureWorkSource


def source(path, **kw):
    return StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=4, **kw)


def batches(pipeline):
    return [digest(b) for b in pipeline]


@pytest.fixture
def texts():
    return make_documents(80, seed=9, min_words=5, max_words=60)


def test_map_before_tokenize_equals_transformed_data(tmp_path, texts, tokenizer_dir):
    write_jsonl(tmp_path / "a" / "d.jsonl", [{"text": t} for t in texts])
    write_jsonl(tmp_path / "b" / "d.jsonl", [{"text": t.upper()} for t in texts])

    def pipeline(path, *maps):
        p = Pipeline(source(path, unit_bytes=2048))
        for fn in maps:
            p = p.map(fn)
        return p.tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2, drop_last=False)

    mapped = batches(pipeline(tmp_path / "a", shout_text))
    assert mapped == batches(pipeline(tmp_path / "b"))
    assert mapped != batches(pipeline(tmp_path / "a"))
    assert batches(pipeline(tmp_path / "a", lambda d: d)) == batches(pipeline(tmp_path / "a"))


def test_map_after_tokenize_sees_token_ids(tmp_path, texts, tokenizer_dir):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    pipeline = (Pipeline(source(tmp_path / "d.jsonl")).tokenize(tokenizer_id=tokenizer_dir)
                .map(first_ten_tokens).batch(4, drop_last=False))
    rows = [r.payload["input_ids"] for b in pipeline for r in b.records]
    assert len(rows) == len(texts)
    assert all(1 <= len(row) <= 10 for row in rows) and max(len(r) for r in rows) == 10


def test_map_from_a_recipe_by_import_path(tmp_path, texts, tokenizer_dir):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    recipe = DataRecipe.from_dict({
        "datasets": [{"name": "d", "path": str(tmp_path / "d.jsonl")}], "seed": 4,
        "tokenize": {"tokenizer": tokenizer_dir},
        "ops": [{"op": "map", "fn": "tests.core.toy_ops:shout_text", "columns": ["text"]}]})
    from_recipe = batches(recipe.build(seq_len=64, microbatch_size=2))
    in_python = (Pipeline(source(tmp_path / "d.jsonl")).map(shout_text)
                 .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))
    assert from_recipe == batches(in_python)
    with pytest.raises(ConfigError, match="has no 'nope'"):
        DataRecipe.from_dict({**recipe_dict(tmp_path, tokenizer_dir),
                              "ops": [{"op": "map", "fn": "tests.core.toy_ops:nope"}]})
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        DataRecipe.from_dict({**recipe_dict(tmp_path, tokenizer_dir),
                              "ops": [{"op": "map", "fn": "no_such_module:f"}]})


def recipe_dict(tmp_path, tokenizer_dir):
    return {"datasets": [{"name": "d", "path": str(tmp_path / "d.jsonl")}],
            "tokenize": {"tokenizer": tokenizer_dir}}


def test_a_renamed_function_refuses_the_resume(tmp_path, texts, tokenizer_dir):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])

    def pipeline(fn):
        return (Pipeline(source(tmp_path / "d.jsonl")).map(fn)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))

    first = pipeline(shout_text)
    next(iter(first))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    pipeline(shout_text).load_state_dict(state)  # same name: accepted

    def shout_text_v2(doc):
        return shout_text(doc)

    with pytest.raises(StateMismatchError, match=r"the map options changed .*shout_text_v2"):
        pipeline(shout_text_v2).load_state_dict(state)


def test_map_resumes_exactly_at_another_size(two_datasets, tokenizer_dir):
    from tests.kit.elastic import build

    def with_map():
        base = build(two_datasets, tokenizer_dir)
        pipeline = Pipeline(base.work_source).map(shout_text, columns=("text",))
        for spec in base.operators:
            pipeline = pipeline.apply(spec)
        return pipeline

    reference = run(with_map(), 2, steps=6)
    pipelines, first = stream(with_map(), 2, 0, 2)
    _, rest = stream(with_map(), 1, 0, 4, merged_state(pipelines))
    assert first + rest == reference


def test_map_errors_name_the_row_and_function(tmp_path, texts, tokenizer_dir):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    pipeline = Pipeline(source(tmp_path / "d.jsonl")).map(not_a_dict).batch(2)
    with pytest.raises(DataError, match=r"d\.jsonl:\d+: map tests\.core\.toy_ops:not_a_dict "
                                        r"returned list, expected a dict"):
        next(iter(pipeline))
    dropped_field = (Pipeline(source(tmp_path / "d.jsonl")).map(lambda d: {"body": d["text"]})
                     .tokenize(tokenizer_id=tokenizer_dir).batch(2))
    with pytest.raises(DataError,
                       match=r"d\.jsonl:\d+: missing field 'text' \(has \['body'\]"):
        next(iter(dropped_field))
    with pytest.raises(ConfigError, match="fn must be a function"):
        Pipeline(source(tmp_path / "d.jsonl")).map(42)


def _fails_on_seven(doc: dict) -> dict:
    if doc["n"] == 7:
        raise KeyError("title")
    return doc


def _keeps_below_seven(doc: dict) -> bool:
    return doc["n"] < 7 or doc["missing"]


@pytest.mark.parametrize("op", ["map", "filter"])
def test_an_error_in_a_user_function_names_the_row(tmp_path, op):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"n": i} for i in range(12)])
    pipeline = Pipeline(source(path, shuffle_units=False, shuffle_rows=False)).options(prefetch=0)
    pipeline = pipeline.map(_fails_on_seven) if op == "map" else \
        pipeline.filter(_keeps_below_seven)
    with pytest.raises(DataError) as caught:
        list(pipeline.batch(1, drop_last=False))
    message = str(caught.value)
    assert "rows.jsonl:8" in message and f"{op} function" in message
    assert ("_fails_on_seven" if op == "map" else "_keeps_below_seven") in message
    assert isinstance(caught.value.__cause__, KeyError)
