"""Ranks that would read different data fail at start, on every rank, naming what differs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.edits import reorder_lines
from zephon.engine.rank_check import _check_dp_ranks, _disagreement, describe, digest
from zephon.errors import ConfigError

WORKER = r"""
import json, sys
import torch.distributed as dist
from zephon import Pipeline
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

rank, store, tokenizer, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
cases = json.loads(sys.argv[5])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
results = {}
for name, case in cases.items():
    mine = case[rank]
    source = StaticMixtureWorkSource(
        [Dataset.from_path("short", mine["path"])], MixtureSpec({"short": 1.0}),
        seed=mine["seed"], unit_bytes=2048)
    pipeline = (Pipeline(source).options(lanes=4, dp_rank=mine["dp_rank"], dp_world_size=2,
                                         prefetch=0)
                .tokenize(tokenizer_id=tokenizer).pack_flat(33).batch(2))
    try:
        batches = sum(1 for _ in pipeline)
        results[name] = {"batches": batches}
    except ConfigError as exc:
        results[name] = {"error": str(exc)}
json.dump(results, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_ranks_that_would_read_different_data_fail_at_start(two_datasets, tokenizer_dir,
                                                            tmp_path):
    short = two_datasets["short"]
    partial = tmp_path / "partial"
    shutil.copytree(short, partial)
    (partial / "part-2.parquet").unlink()  # a node that misses a file
    node_a, node_b = tmp_path / "node_a", tmp_path / "node_b"
    shutil.copytree(two_datasets["long"], node_a)
    shutil.copytree(two_datasets["long"], node_b)
    reorder_lines(node_b / "part-1.jsonl", 8, 22)  # a copy that differs in its middle
    same = {"path": str(short), "seed": 1}
    cases = {
        "agree": [{**same, "dp_rank": 0}, {**same, "dp_rank": 1}],
        "seed_is_rank": [{**same, "dp_rank": 0}, {**same, "seed": 2, "dp_rank": 1}],
        "one_dp_rank": [{**same, "dp_rank": 0}, {**same, "dp_rank": 0}],
        "missing_file": [{**same, "dp_rank": 0}, {**same, "path": str(partial), "dp_rank": 1}],
        "middle_differs": [{**same, "path": str(node_a), "dp_rank": 0},
                           {**same, "path": str(node_b), "dp_rank": 1}],
    }
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"),
                               tokenizer_dir, str(outs[r]), json.dumps(cases)], env=env)
             for r in range(2)]
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    results = [json.loads(p.read_text()) for p in outs]
    for result in results:  # every rank reaches the same verdict
        assert result["agree"]["batches"] > 0
        assert "the seed" in result["seed_is_rank"]["error"]
        assert "work_source.seed: rank 0 has 1, rank 1 has 2" in \
            result["seed_is_rank"]["error"]
        assert "dp_rank 0 is claimed by ranks [0, 1]" in result["one_dp_rank"]["error"]
        assert "the datasets or their files" in result["missing_file"]["error"]
        assert "work_source.datasets.short.files: rank 0 has" in result["missing_file"]["error"]
        assert "the datasets or their files" in result["middle_differs"]["error"]
        assert ("work_source.datasets.short.versions.part-1.jsonl: rank 0 has"
                in result["middle_differs"]["error"])
    assert results[0]["agree"] == results[1]["agree"]


def test_digest_follows_content_not_order_of_keys():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})


def test_the_message_names_each_differing_rank_and_the_operator():
    base = {"lanes": 4, "ops": [{"op": "tokenize", "field": "text"}]}
    other = {"lanes": 4, "ops": [{"op": "tokenize", "field": "body"}]}
    message = _disagreement([base, base, other], ["tokenizer or tokenize"])
    assert "rank 2 differs from rank 0 in the tokenizer or tokenize options" in message
    assert "ops[0].field: rank 0 has 'text', rank 2 has 'body'" in message
    assert "rank 1" not in message
    assert describe("work_units.web") == "the work units cut from the files"
    assert describe("work_source.seed") == "the seed (a seed derived from the rank?)"


def test_tensor_parallel_peers_may_share_a_dp_rank_but_not_more():
    """A group over the whole world holds TP/PP peers that read the same lanes: with 4 ranks
    and dp size 2, each dp_rank belongs to exactly 2 of them."""
    _check_dp_ranks([0, 0, 1, 1], peers=2)
    _check_dp_ranks([0, 1], peers=1)
    with pytest.raises(ConfigError, match=r"dp_rank 0 is claimed by ranks \[0, 1, 2\]"):
        _check_dp_ranks([0, 0, 0, 1], peers=2)
    with pytest.raises(ConfigError, match="no rank holds dp_rank 1"):
        _check_dp_ranks([0, 2], peers=1)
