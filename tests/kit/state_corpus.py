"""A small two-dataset corpus, its pipeline and its loader state mid-run, for the state
validation and fuzz tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import write_jsonl, write_parquet
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.io import Dataset
from zephon.ops.base import OperatorSpec
from zephon.work import StaticMixtureWorkSource

STEPS = 4
"""Microbatches consumed before the state is taken: 2 per lane, so lanes' entries look alike."""


def write_corpus(root: Path) -> dict[str, Path]:
    """A Parquet dataset ``a`` (12 row groups of 8 rows) and a JSON Lines dataset ``b``
    (byte-range units): every lane reads several units of each."""
    texts = make_documents(192, seed=3, min_words=10, max_words=40)
    write_parquet(root / "a" / "part.parquet", texts[:96], row_group_size=8)
    write_jsonl(root / "b" / "part.jsonl", [{"text": t} for t in texts[96:]])
    return {"a": root / "a", "b": root / "b"}


def build(corpus, tokenizer, *extra: OperatorSpec, seed: int = 5) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_path("a", corpus["a"]), Dataset.from_path("b", corpus["b"])], seed=seed,
        unit_bytes=1024)
    pipeline = (Pipeline(source).options(lanes=2, prefetch=0).tokenize(tokenizer=tokenizer)
                .pack_flat(16, "first_fit", max_open_bins=3))
    for spec in extra:
        pipeline = pipeline.apply(spec)
    return pipeline.shuffle(3).batch(2)


def mid_run(pipeline: Pipeline, steps: int = STEPS) -> dict[str, Any]:
    """The state after ``steps`` microbatches, as a checkpoint holds it (through JSON)."""
    iterator = iter(pipeline)
    for _ in range(steps):
        next(iterator)
    return json.loads(json.dumps(pipeline.state_dict()))
