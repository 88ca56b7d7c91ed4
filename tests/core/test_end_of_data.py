"""End of data with several ranks: equal batch counts (no hung collective), nothing unreported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = r"""
import json, sys
import torch.distributed as dist
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

rank, world, store, out, short, long, tokenizer = sys.argv[1:8]
rank, world = int(rank), int(world)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
source = StaticMixtureWorkSource(
    [Dataset.from_path("short", short), Dataset.from_path("long", long)],
    MixtureSpec({"short": 0.5, "long": 0.5}), seed=5, on_exhausted="drain", unit_bytes=2048)
pipeline = (Pipeline(source).options(lanes=4, dp_rank=rank, dp_world_size=world)
            .tokenize(tokenizer_id=tokenizer).pack_flat(65, "first_fit").batch(3))
batches = 0
tokens = 0
for batch in pipeline:
    batches += 1
    tokens += sum(s.length for r in batch.records for s in r.meta["documents"])
    dist.barrier()  # a collective per step, as a trainer has: a rank that stops early hangs it
report = pipeline.report()
json.dump({"batches": batches, "tokens": tokens, "leftover": report.leftover,
           "dropped": report.dropped, "read": sum(d.tokens for d in report.datasets)},
          open(out, "w"))
dist.destroy_process_group()
"""


def run_workers(tmp_path: Path, source: str, world: int, *args: object) -> list[dict]:
    """Runs the script ``source`` as ``world`` gloo ranks, each with the arguments ``rank
    world store out *args``, joined over a file store of their own (no port to pick); their
    JSON outputs, by rank."""
    run = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    run.mkdir()
    script = run / "worker.py"
    script.write_text(source)
    outs = [run / f"rank{r}.json" for r in range(world)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world),
                               str(run / "store"), str(outs[r]), *map(str, args)], env=env)
             for r in range(world)]
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    return [json.loads(p.read_text()) for p in outs]


def accounts_for_every_token(results: list[dict]) -> None:
    """Everything the job's lanes read was handed out, dropped at a flush, or left over (a
    rank hands out other ranks' lanes in the last round, so only the job's sums agree), and
    the last round left fewer microbatches over than there are ranks."""
    assert sum(r["tokens"] + r["leftover"]["tokens"] + r["dropped"]["tokens"]
               for r in results) == sum(r["read"] for r in results)
    assert sum(r["leftover"]["microbatches"] for r in results) < len(results)


@pytest.mark.multiprocess
def test_ranks_stop_together_and_account_for_every_token(two_datasets, tokenizer_dir, tmp_path):
    results = run_workers(tmp_path, WORKER, 2, two_datasets["short"], two_datasets["long"],
                          tokenizer_dir)
    assert results[0]["batches"] == results[1]["batches"] > 0
    accounts_for_every_token(results)


COUNTING_WORKER = r"""
import json, sys
import torch.distributed as dist
calls = [0]
real = dist.all_reduce
def counted(*args, **kwargs):
    calls[0] += 1
    return real(*args, **kwargs)
dist.all_reduce = counted
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

import time
rank, world, store, out, short, long, tokenizer, prefetch, pause, budget = sys.argv[1:11]
rank, world, pause, budget = int(rank), int(world), float(pause), int(budget)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
source = StaticMixtureWorkSource(
    [Dataset.from_path("short", short), Dataset.from_path("long", long)],
    MixtureSpec({"short": 0.5, "long": 0.5}), seed=5, on_exhausted="drain", unit_bytes=2048)
options = {"read_ahead_tokens": budget} if budget else {}
pipeline = (Pipeline(source).options(lanes=8, dp_rank=rank, dp_world_size=world,
                                     prefetch=int(prefetch), **options)
            .tokenize(tokenizer_id=tokenizer).pack_flat(33, "wrap").batch(1))
batches, in_rounds, tokens, before = 0, 0, 0, calls[0]
for batch in pipeline:
    batches += 1
    in_rounds += batch.position is None  # not from the last round, which needs no agreement
    tokens += sum(s.length for r in batch.records for s in r.meta["documents"])
    time.sleep(pause)  # a trainer's step
agreements = calls[0] - before
dist.barrier()
report = pipeline.report()
json.dump({"batches": batches, "in_rounds": in_rounds, "tokens": tokens,
           "agreements": agreements,
           "kinds": pipeline.loader().stream.agreements,
           "leftover": report.leftover, "dropped": report.dropped,
           "read": sum(d.tokens for d in report.datasets)}, open(out, "w"))
dist.destroy_process_group()
"""


def run_ranks(tmp_path, two_datasets, tokenizer_dir, world, prefetch, pause=0.0, budget=0):
    return run_workers(tmp_path, COUNTING_WORKER, world, two_datasets["short"],
                       two_datasets["long"], tokenizer_dir, prefetch, pause, budget)


ROUND_TOKENS = 2 * 33  # 8 lanes over 4 ranks, microbatches of one 33-token row


@pytest.mark.multiprocess
def test_four_ranks_agree_far_less_than_once_per_round(two_datasets, tokenizer_dir,
                                                       tmp_path):
    """A tight loop outruns its producer: it waits for 1, 2, 4, ... 16 rounds before it
    agrees, so its agreements stay far below one per round; prefetch=0 agrees per round."""
    ahead = run_ranks(tmp_path, two_datasets, tokenizer_dir, 4, prefetch=4,
                      budget=32 * ROUND_TOKENS)
    per_round = run_ranks(tmp_path, two_datasets, tokenizer_dir, 4, prefetch=0)
    batches = {r["batches"] for r in ahead}
    assert len(batches) == 1 and batches.pop() > 50  # every rank the same number
    assert [r["batches"] for r in per_round] == [r["batches"] for r in ahead]
    rounds = ahead[0]["in_rounds"] // 2  # 8 lanes over 4 ranks: 2 microbatches a round
    for result in ahead:
        assert result["agreements"] <= rounds / 4 + 4, (result["agreements"], rounds)
    accounts_for_every_token(ahead)
    assert all(r["agreements"] >= rounds for r in per_round)  # prefetch=0: one per round
    # Whether an agreement is issued ahead or on demand is itself agreed: every rank issues
    # the same collectives in the same order.
    assert all(r["kinds"] == ahead[0]["kinds"] for r in ahead)


@pytest.mark.multiprocess
def test_a_trainer_paced_consumer_agrees_ahead_of_need(two_datasets, tokenizer_dir, tmp_path):
    """With a step between microbatches the producers run ahead (here at most 4 rounds), and
    the agreements go out asynchronously, halfway through the rounds the last one granted,
    instead of when the consumer needs them."""
    paced = run_ranks(tmp_path, two_datasets, tokenizer_dir, 4, prefetch=4, pause=0.01,
                      budget=4 * ROUND_TOKENS)
    batches = {r["batches"] for r in paced}
    assert len(batches) == 1 and batches.pop() > 50
    kinds = paced[0]["kinds"]
    assert all(r["kinds"] == kinds for r in paced)
    assert all(r["agreements"] == kinds["ahead"] + kinds["on_demand"] for r in paced)
    assert kinds["ahead"] > 2 * kinds["on_demand"], kinds
    rounds = paced[0]["in_rounds"] // 2
    assert paced[0]["agreements"] <= rounds / 2 + 4  # each grants about 2/3 of the lead
    accounts_for_every_token(paced)


EMPTY_WORKER = r"""
import json, sys
import torch.distributed as dist
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

rank, world, store, out, path = sys.argv[1:6]
rank, world = int(rank), int(world)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
source = StaticMixtureWorkSource([Dataset.from_path("web", path)], shuffle_units=False)
base = Pipeline(source).options(lanes=2, dp_rank=rank, dp_world_size=world)
results = {}
for case, keep in (("all_filtered", lambda d: False),
                   ("lane_1_filtered", lambda d: d["text"] != "skip me"),
                   ("one_row", lambda d: d["text"] == "text 0")):
    try:
        results[case] = len(list(base.filter(keep).batch(1, drop_last=False)))
    except Exception as exc:
        results[case] = f"{type(exc).__name__}: {exc}"
    dist.barrier()  # a rank that did not stop with its peer would hang here
json.dump(results, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_an_empty_run_is_an_error_on_every_rank(tmp_path):
    """Two ranks of one lane each. Every row filtered: both ranks say so. Only lane 1's rows
    filtered (six units of two rows, not shuffled: lane l reads units l, l + 2, l + 4): no
    round is complete, but the last round hands lane 0's six microbatches out, three to each
    rank. One row kept: one microbatch for two ranks, so both raise saying so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ["skip me" if (i // 2) % 2 else f"text {i}" for i in range(12)]
    pq.write_table(pa.table({"text": rows}), tmp_path / "d.parquet")
    results = run_workers(tmp_path, EMPTY_WORKER, 2, tmp_path / "d.parquet")
    for rank, result in enumerate(results):
        assert result["all_filtered"] == (
            f"DataError: no microbatch could be made on rank {rank} of 2 (lanes [{rank}]): 6 "
            "row(s) were read and every one was dropped. Check the filters and the text field "
            "('web': 6 row(s) read, 0 document(s) delivered, dropped "
            "filtered:__main__:<lambda>: 6)")
    assert [r["lane_1_filtered"] for r in results] == [3, 3]
    for rank, result in enumerate(results):
        assert result["one_row"].startswith(
            f"DataError: no microbatch could be made on rank {rank} of 2 (lanes [{rank}]): the "
            "lanes made 1 microbatch(es) in all, fewer than one for each of the 2 data-parallel "
            "ranks")
