"""Dataset sources: read-ahead batches bounded in characters, documents unchanged."""

from __future__ import annotations

from zephon import Pipeline
from zephon.engine import dataset_source as source_module
from zephon.io import Dataset
from zephon.ops.tokenize import DocumentTokenizer
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def run(paths: dict, tokenizer_dir: str) -> list[list[int]]:
    datasets = [Dataset.from_path(n, p) for n, p in paths.items()]
    source = StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(paths, 1.0)), seed=3)
    pipeline = (Pipeline(source).options(lanes=2, prefetch=0)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))
    return [r.payload["input_ids"].tolist() for b in pipeline for r in b.records]


def test_read_ahead_batches_end_at_a_character_budget(two_datasets, tokenizer_dir,
                                                      monkeypatch) -> None:
    batches: list[list[int]] = []  # characters of each document, per read-ahead batch
    real = DocumentTokenizer.apply

    def recorded(self, docs, where):
        batches.append([len(d.fields["text"]) for d in docs])
        return real(self, docs, where)

    monkeypatch.setattr(DocumentTokenizer, "apply", recorded)
    unbounded = run(two_datasets, tokenizer_dir)
    widest = max(sum(b) for b in batches)
    monkeypatch.setattr(source_module, "CHUNK_CHARS", 3000)
    batches.clear()
    bounded = run(two_datasets, tokenizer_dir)
    assert widest > 3000
    # a batch ends with the document that reaches the budget
    assert all(sum(b[:-1]) < 3000 for b in batches)
    assert max(sum(b) for b in batches) < widest
    assert bounded == unbounded
