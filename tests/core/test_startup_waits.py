"""Start-up never leaves a rank waiting for ever: a peer whose start-up fails is named at once
with its error, and a peer that never arrives is named once ``startup_timeout_s`` has passed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from zephon.distributed import launcher_store

RANK = r"""
import json, os, sys, time
import torch.distributed as dist
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

corpus, tokenizer, case = sys.argv[1:4]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
if case == "absent" and rank == 1:
    time.sleep(3600)  # alive, in the job, but never builds its pipeline
if case == "missing" and rank == 1:
    corpus = corpus + "-not-here"  # a node that lacks the data
if case == "tokenizer" and rank == 1:
    tokenizer = tokenizer + "-not-here"
source = StaticMixtureWorkSource([Dataset.from_path("d", corpus)], MixtureSpec({"d": 1.0}))
pipeline = (Pipeline(source).options(lanes=2, dp_rank=rank, dp_world_size=2, prefetch=0,
                                     startup_timeout_s=3)
            .tokenize(tokenizer_id=tokenizer).pack_flat(65).batch(2))
started = time.monotonic()
try:
    batches = sum(1 for _ in pipeline)
    print(json.dumps({"batches": batches}), flush=True)
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}",
                      "seconds": time.monotonic() - started}), flush=True)
os._exit(0)  # no teardown collective with a peer that failed
"""


def run_job(tmp_path, demo_assets, case: str) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    store, env = launcher_store(2)
    procs = [subprocess.Popen([sys.executable, str(script), demo_assets["corpus"],
                               demo_assets["tokenizer"], case], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env, "RANK": str(rank)})
             for rank in range(2)]
    results = []
    try:
        for rank, proc in enumerate(procs):
            if case == "absent" and rank == 1:
                results.append({})
                continue
            out, err = proc.communicate(timeout=240)
            lines = [x for x in out.splitlines() if x.startswith("{")]
            assert lines, err[-3000:]
            results.append(json.loads(lines[-1]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        del store
    return results


@pytest.mark.multiprocess
@pytest.mark.parametrize("case, named", [
    ("missing", r"rank 1 failed at start-up: .*not-here"),
    ("tokenizer", r"rank 1 failed at start-up: .*not-here"),
])
def test_a_peer_whose_start_up_fails_is_named_at_once(tmp_path, demo_assets, case, named):
    started = time.monotonic()
    waiting, failed = run_job(tmp_path, demo_assets, case)
    assert "not-here" in failed["error"]
    assert re.search(named, waiting["error"]), waiting
    assert "PeerDataError" in waiting["error"] or "PeerConfigError" in waiting["error"]
    # Named from the failure itself, not after the 3 s timeout (nor torch's 30 minutes).
    assert "did not" not in waiting["error"]
    assert time.monotonic() - started < 200


@pytest.mark.multiprocess
def test_a_peer_that_never_arrives_is_named_after_the_timeout(tmp_path, demo_assets):
    waiting, _ = run_job(tmp_path, demo_assets, "absent")
    assert "rank(s) [1] did not reach zephon's process group within 3 s" in waiting["error"]
    assert "startup_timeout_s" in waiting["error"]
