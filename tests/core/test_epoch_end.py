"""An epoch of a dataset read once delivers its documents, in the same global order at every
data-parallel size (real ranks on gloo, agreeing on the end). The rounds end when the first
lane does (2.2% of the epoch unread here at that point, with units dealt balanced by size); the
last round hands out what the other lanes hold, in one order at every size, leaving at most
``W - 1`` microbatches, and the lanes' own ends (a short last row and batch each) the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_jsonl, write_parquet
from zephon.demo.assets import make_documents
from zephon.distributed import launcher_store

RANK = r"""
import hashlib, json, os, sys
import torch.distributed as dist
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

data, tokenizer, out, load, take, prefetch = sys.argv[1:7]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if world > 1:
    dist.init_process_group("gloo")
source = StaticMixtureWorkSource([Dataset.from_path("d", data)], unit_bytes=4096)
pipeline = (Pipeline(source).options(lanes=8, dp_rank=rank, dp_world_size=world,
                                     prefetch=int(prefetch))
            .tokenize(tokenizer_id=tokenizer).pack_flat(33).batch(2))
if load:  # every rank's state of the run before, merged
    state = {}
    for path in load.split(","):
        state.update(json.load(open(path)))
    pipeline.load_state_dict(state)
handed = []
for batch in pipeline:
    tokens = sum(s.length for r in batch.records for s in r.meta["documents"])
    digest = hashlib.sha256(b"".join(r.payload["input_ids"].tobytes()
                                     for r in batch.records)).hexdigest()[:12]
    handed.append([batch.global_microbatch(8), digest, tokens, batch.position is not None])
    if len(handed) == int(take):
        break
json.dump(handed, open(out, "w"))
json.dump(pipeline.state_dict(), open(out + ".state", "w"))
if world > 1:
    dist.destroy_process_group()
"""


def corpus(root: Path, files: int, kind: str) -> Path:
    texts = make_documents(1500, seed=8, min_words=50, max_words=200)
    for i in range(files):
        part = texts[i::files]
        if kind == "jsonl":
            write_jsonl(root / f"part-{i}.jsonl", [{"text": t} for t in part])
        else:
            write_parquet(root / f"part-{i}.parquet", part, row_group_size=4)
    return root


def total_tokens(data: Path, tokenizer_dir: str) -> int:
    """Every token of the dataset, as one lane packs them, its last partial row included."""
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", data)]))
                .options(lanes=1, prefetch=0).tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(33).batch(2, drop_last=False))
    return sum(s.length for b in pipeline for r in b.records for s in r.meta["documents"])


def job(tmp_path: Path, data: Path, tokenizer_dir: str, world: int, load: list[Path] = (),
        take: int = 0, prefetch: int = 2) -> tuple[list[list], list[Path]]:
    """The global microbatches a job of ``world`` ranks hands out, in order (``take``: each
    rank stops after that many, 0: at the end of the data; ``load``: the state files to
    resume from), and its ranks' state files."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    store, env = launcher_store(world)
    run = len(list(tmp_path.glob("run*")))
    outs = [tmp_path / f"run{run}-w{world}-rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, str(script), str(data), tokenizer_dir,
                               str(outs[r]), ",".join(map(str, load)), str(take),
                               str(prefetch)], env={**os.environ, **env, "RANK": str(r)})
             for r in range(world)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    del store
    handed = sorted(item for out in outs for item in json.loads(out.read_text()))
    return handed, [Path(f"{out}.state") for out in outs]


@pytest.mark.multiprocess
@pytest.mark.parametrize("files, kind", [(6, "jsonl"), (40, "parquet")])
def test_an_epoch_leaves_at_most_one_percent_unread_in_one_order(tmp_path, tokenizer_dir,
                                                                 files, kind):
    data = corpus(tmp_path / "data", files, kind)
    total = total_tokens(data, tokenizer_dir)
    reference, _ = job(tmp_path, data, tokenizer_dir, 1)
    assert [g for g, *_ in reference] == list(range(len(reference)))
    assert len(reference) > 8 * 300
    for world in (1, 2, 4):
        handed = reference if world == 1 else job(tmp_path, data, tokenizer_dir, world)[0]
        assert handed == reference[:len(handed)]  # one global order
        assert len(reference) - len(handed) < world
        unread = 1 - sum(t for _, _, t, _ in handed) / total
        assert 0 <= unread <= 0.01, f"W={world}: {unread:.2%} of {total} tokens unread"


@pytest.mark.multiprocess
def test_a_resume_inside_the_last_round_continues_it_at_any_size(tmp_path, tokenizer_dir):
    """States saved inside the last round (W=2, with and without read-ahead) resume at 1, 2
    and 4 ranks, and one saved at W=1 resumes at 2: each run goes on with the next global
    microbatch of the one order, to the same end."""
    data = corpus(tmp_path / "data", 6, "jsonl")
    reference, _ = job(tmp_path, data, tokenizer_dir, 1)
    last_round = next(g for g, _, _, last in reference if last)
    assert last_round % 8 == 0 and len(reference) - last_round > 20
    for world, prefetch, after in ((2, 2, 1), (2, 0, 2), (2, 2, 4), (1, 2, 2)):
        take = last_round // world + 3  # 3 microbatches a rank into the last round
        first, states = job(tmp_path, data, tokenizer_dir, world, take=take, prefetch=prefetch)
        assert {entry["tail_from"] for p in states
                for entry in json.loads(p.read_text()).values()} == {last_round}
        rest, _ = job(tmp_path, data, tokenizer_dir, after, load=states)
        whole = first + rest
        assert whole == reference[:len(whole)], (world, after)
        assert len(reference) - len(whole) < max(world, after)
