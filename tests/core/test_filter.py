"""``filter``: documents a user function rejects are dropped and counted."""

from __future__ import annotations

import pytest

from tests.conftest import write_jsonl
from tests.core.toy_ops import keep_even_length, keep_odd_length
from tests.kit.elastic import digest, merged_state, run, stream
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.errors import DataError
from zephon.io import Dataset
from zephon.recipe import DataRecipe
from zephon.work import StaticMixtureWorkSource


@pytest.fixture
def corpus(tmp_path):
    texts = make_documents(90, seed=12, min_words=5, max_words=40)
    for i in range(3):
        write_jsonl(tmp_path / "d" / f"{i}.jsonl", [{"text": t} for t in texts[i::3]])
    return tmp_path / "d", texts


def pipeline_for(path, tokenizer_dir, *filters, lanes=1):
    source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=2, unit_bytes=1024)
    p = Pipeline(source).options(lanes=lanes)
    for fn in filters:
        p = p.filter(fn)
    return p.tokenize(tokenizer_id=tokenizer_dir).batch(1, drop_last=False)


def test_rejected_documents_are_counted_and_absent(corpus, tokenizer_dir):
    path, texts = corpus
    pipeline = pipeline_for(path, tokenizer_dir, keep_even_length)
    kept = [r.meta["documents"][0].doc_id for b in pipeline for r in b.records]
    report = pipeline.report()
    [dataset] = report.datasets
    odd = sum(1 for t in texts if len(t) % 2)
    assert dataset.filtered == odd > 0
    assert dataset.skipped == {"filtered:tests.core.toy_ops:keep_even_length": odd}
    assert len(kept) == dataset.documents == len(texts) - odd
    assert "filtered:tests.core.toy_ops:keep_even_length" in str(report)


def test_filters_compose_and_count_separately(corpus, tokenizer_dir):
    path, texts = corpus
    pipeline = pipeline_for(path, tokenizer_dir, keep_even_length, keep_odd_length)
    with pytest.raises(DataError, match="every one was dropped"):
        list(pipeline)
    [dataset] = pipeline.report().datasets
    assert sum(dataset.skipped.values()) == dataset.filtered == len(texts)


def test_filter_after_tokenize(corpus, tokenizer_dir):
    path, _ = corpus
    source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=2)
    pipeline = (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir)
                .filter(lambda d: len(d["input_ids"]) < 30).batch(1, drop_last=False))
    lengths = [len(r.payload["input_ids"]) for b in pipeline for r in b.records]
    assert lengths and max(lengths) < 30
    assert pipeline.report().datasets[0].filtered > 0


def test_filter_resumes_exactly_at_another_size(corpus, tokenizer_dir):
    path, _ = corpus
    base = (pipeline_for(path, tokenizer_dir, keep_even_length, lanes=4)
            .operators)

    def build():
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=2,
                                         unit_bytes=1024, repeat=True)
        p = Pipeline(source)
        for spec in base[:-1]:
            p = p.apply(spec)
        return p.pack_flat(33).batch(2)

    reference = run(build(), 2, steps=5)
    pipelines, first = stream(build(), 4, 0, 2)
    _, rest = stream(build(), 1, 0, 3, merged_state(pipelines))
    assert first + rest == reference


def test_filter_in_a_recipe(corpus, tokenizer_dir):
    path, texts = corpus
    recipe = DataRecipe.from_dict({
        "seed": 2, "datasets": [{"name": "d", "path": str(path)}],
        "work": {"unit_bytes": 1024}, "batch": {"drop_last": False},
        "tokenize": {"tokenizer": tokenizer_dir},
        "ops": [{"op": "filter", "fn": "tests.core.toy_ops:keep_even_length"}]})
    from_recipe = recipe.build(seq_len=32, microbatch_size=1)
    source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=2, unit_bytes=1024)
    in_python = (Pipeline(source).filter(keep_even_length).tokenize(tokenizer_id=tokenizer_dir)
                 .pack_flat(33).batch(1, drop_last=False))
    assert [digest(b) for b in from_recipe] == [digest(b) for b in in_python]
    assert from_recipe.report().datasets[0].filtered == sum(1 for t in texts if len(t) % 2)
