"""One corpus in every format Zephon reads locally (Parquet, JSON Lines .zst, MDS written by
Streaming, LitData written by LitData) gives the same global batches token for token at W=1
and W=2, and resumes exactly across formats: the formats change how rows are stored, never
which rows form a unit or in which order they come.

The corpus is the MDS fixture's shards, plain and zstd-compressed (tests/data/mds: twelve
shards, each row twice). Every other format stores the same rows in twelve files (LitData:
twelve one-chunk datasets under one folder, written by LitData's own writer), so each file is
one unit in every format: ``arrow_unit_rows`` is above the largest shard, and two lanes ask
for 8 units, fewer than the files (a compressed JSON Lines file cannot be split, the others
could)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.kit.elastic import take_steps
from tests.kit.mds import EXPECTED, MDS
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

LANES = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    from litdata.streaming.writer import BinaryWriter

    root = tmp_path_factory.mktemp("same-corpus")
    counts = [s["samples"] for s in json.loads((MDS / "plain" / "index.json").read_text())
              ["shards"]]
    texts = [e["text"] for e in EXPECTED]
    parts, start = [], 0
    for count in counts:
        parts.append(texts[start:start + count])
        start += count
    assert start == len(texts) and len(parts) == 6
    (root / "parquet").mkdir()
    (root / "jsonl").mkdir()
    for k, part in enumerate(parts + parts):  # the plain shards, then the zstd ones
        pq.write_table(pa.table({"text": part}), root / "parquet" / f"part-{k:02d}.parquet",
                       row_group_size=len(part))
        lines = "".join(json.dumps({"text": t}) + "\n" for t in part).encode()
        (root / "jsonl" / f"part-{k:02d}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(lines))
        writer = BinaryWriter(str(root / "litdata" / f"part-{k:02d}"), chunk_size=len(part))
        for i, text in enumerate(part):
            writer[i] = {"text": text}
        writer.done()
        writer.merge()
    return {"parquet": root / "parquet", "jsonl.zst": root / "jsonl",
            "mds": f"{MDS}/*/shard.*", "litdata": root / "litdata"}


def pipeline(path: Path | str, tokenizer_dir: str) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("corpus", path)],
                                     MixtureSpec({"corpus": 1.0}), seed=11, repeat=True,
                                     arrow_unit_rows=64)
    return (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(41, "wrap")
            .shuffle(8).batch(2))


def ranks(base: Pipeline, world: int, state: dict | None = None) -> list[Pipeline]:
    pipelines = [base.options(lanes=LANES, dp_rank=r, dp_world_size=world)
                 for r in range(world)]
    for p in pipelines:
        if state is not None:
            p.load_state_dict(state)
    return pipelines


def steps(pipelines: list[Pipeline], count: int) -> list:
    return take_steps(pipelines, [iter(p) for p in pipelines], count, 2 // len(pipelines))


def test_every_format_gives_the_same_global_batches_at_w1_and_w2(corpus, tokenizer_dir):
    reference = steps(ranks(pipeline(corpus["parquet"], tokenizer_dir), 1), 10)
    for name, path in corpus.items():
        for world in (1, 2):
            got = steps(ranks(pipeline(path, tokenizer_dir), world), 10)
            assert got == reference, f"{name} at W={world}"


def test_a_checkpoint_of_one_format_resumes_exactly_over_another(corpus, tokenizer_dir):
    """The checkpoint's data fingerprint names the files, so a checkpoint is refused over
    other files; within one format it resumes exactly, at another W."""
    for name in ("jsonl.zst", "mds", "litdata"):
        base = pipeline(corpus[name], tokenizer_dir)
        reference = steps(ranks(base, 1), 9)
        first_ranks = ranks(base, 2)
        first = steps(first_ranks, 4)
        state = {}
        for p in first_ranks:
            state.update(pickle.loads(pickle.dumps(p.state_dict())))
        assert first + steps(ranks(base, 1, state), 5) == reference, name
