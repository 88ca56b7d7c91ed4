"""The kit's loader-state envelope: every form an adapter saves reads back through one reader,
resumes exactly, and whatever was not written by zephon, damaged, edited or mixed from other
runs is refused by name."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_jsonl
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.distributed import launcher_store
from zephon.errors import StateMismatchError
from zephon.integration import (
    job_state,
    rank_state,
    read_state,
    state_as_text,
    state_from_text,
)
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource


def pipeline(data_dir: Path, tokenizer_dir: str, rank: int = 0, world: int = 1) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("d", str(data_dir))])
    return (Pipeline(source).options(lanes=4, dp_rank=rank, dp_world_size=world, prefetch=0)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(33).batch(2))


@pytest.fixture
def data(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "d" / "a.jsonl",
                [{"text": t} for t in make_documents(200, seed=3)])
    return tmp_path / "d"


def tokens(batch) -> list[list[int]]:
    return [r.payload["input_ids"].tolist() for r in batch.records]


def after(p: Pipeline, skip: int, take: int) -> list:
    it = iter(p)
    for _ in range(skip):
        next(it)
    return [tokens(next(it)) for _ in range(take)]


def test_rank_envelopes_of_two_ranks_resume_one_reader_exactly(data, tokenizer_dir):
    reference = after(pipeline(data, tokenizer_dir), 0, 10)
    ranks = [pipeline(data, tokenizer_dir, r, 2) for r in range(2)]
    iterators = [iter(p) for p in ranks]
    for _ in range(3):  # global microbatches 0..5
        for it in iterators:
            next(it)
    saved = [json.loads(json.dumps(rank_state(p.state_dict(), lanes=4, framework={"step": 3})))
             for p in ranks]
    assert all(s["artifact"] == "loader_state" and s["scope"] == "rank" for s in saved)
    found = read_state(saved, "saved")
    assert found.lanes == found.lane_count == 4 and found.framework == [{"step": 3}] * 2
    assert sorted(found.entries) == [f"lane_{n}" for n in range(4)]
    one = pipeline(data, tokenizer_dir)
    one.load_state_dict(found.entries)
    assert after(one, 0, 4) == reference[6:10]


def test_the_per_lane_text_form_reads_back_and_a_pickle_is_refused(data, tokenizer_dir):
    p = pipeline(data, tokenizer_dir)
    after(p, 2, 0)
    text = state_as_text(p.state_dict())
    assert all(isinstance(v, str) for v in text.values())
    assert state_from_text(text, "dcp") == p.state_dict()
    damaged = {**text, "lane_1": pickle.dumps(p.state_dict()["lane_1"])}
    with pytest.raises(StateMismatchError, match="lane_1 is pickled bytes"):
        read_state(damaged, "dcp")


def test_what_is_not_a_sound_envelope_is_refused_by_name(data, tokenizer_dir):
    p = pipeline(data, tokenizer_dir)
    after(p, 2, 0)
    entries = p.state_dict()
    envelope = rank_state(entries, lanes=4)
    edited = {**envelope, "lanes": 8}
    with pytest.raises(StateMismatchError, match=r"sha256 .* changed or damaged"):
        read_state(edited, "ckpt")
    from zephon.artifacts import sealed

    newer = sealed("loader_state", {**{k: v for k, v in envelope.items()
                                       if k not in ("artifact", "sha256")}, "version": 2})
    with pytest.raises(StateMismatchError, match="ckpt: version is 2"):
        read_state(newer, "ckpt")
    with pytest.raises(StateMismatchError, match=r"keys \['input_ids'\] are not lane entries"):
        read_state({"input_ids": [1, 2]}, "ckpt")
    with pytest.raises(StateMismatchError, match="lane_2 is beyond the 2 lanes"):
        read_state(rank_state(entries, lanes=2), "ckpt")
    with pytest.raises(StateMismatchError, match="written by a run of 8 lanes"):
        read_state([envelope, rank_state({}, lanes=8)], "ckpt")
    later = pipeline(data, tokenizer_dir)
    after(later, 3, 0)
    with pytest.raises(StateMismatchError, match="different entries for 'lane_0'"):
        read_state([envelope, rank_state(later.state_dict(), lanes=4)], "ckpt")
    with pytest.raises(StateMismatchError, match="a loader state is a mapping, not"):
        read_state("[1, 2]", "ckpt")


def test_the_megatron_adapters_envelope_of_zephon_0_3_still_loads(data, tokenizer_dir):
    p = pipeline(data, tokenizer_dir)
    after(p, 2, 0)
    old = {"format": "zephon_megatron.loader", "version": 1, "role": "train",
           "micro_batch_size": 2, "consumed_samples": 4, "lanes": 4,
           "pipeline": p.state_dict()}
    found = read_state(old, "iter_0000002")
    assert found.entries == p.state_dict() and found.lanes == 4
    assert found.framework == [{"role": "train", "micro_batch_size": 2, "consumed_samples": 4}]
    with pytest.raises(StateMismatchError, match="version 2 is not one zephon reads"):
        read_state({**old, "version": 2}, "iter_0000002")


JOB = r"""
import json, os, sys
import torch.distributed as dist
from zephon.errors import StateMismatchError
from zephon.integration import job_state, reader_group
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
mine = {f"lane_{rank}": {"fingerprint": {"lanes": 2}, "rank": rank}}
out = {}
for case, entries in (("good", mine), ("none", mine if rank == 0 else {}),
                      ("bad", {"lane_1": "not json"} if rank == 1 else mine)):
    try:
        out[case] = job_state(entries, group=reader_group(2))
    except StateMismatchError as exc:
        out[case] = str(exc)
json.dump(out, open(sys.argv[1] + f".{rank}", "w"))
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_a_job_state_gathers_every_ranks_lanes_as_json(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    store, env = launcher_store(2)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")],
                              env={**os.environ, **env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    del store
    assert [p.returncode for p in procs] == [0, 0], logs
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    for case, lanes in (("good", ["lane_0", "lane_1"]), ("none", ["lane_0"])):
        assert ranks[0][case] == ranks[1][case] and ranks[0][case]["scope"] == "job"
        found = read_state(ranks[0][case], "job")
        assert sorted(found.entries) == lanes and found.lanes == 2
    # what a peer sends is checked as any state read back: both ranks refuse it, naming it
    assert all("rank 1's loader state: lane_1 is text that is not JSON" in r["bad"]
               for r in ranks), ranks


def test_a_job_state_of_one_reader_is_its_own_and_none_without_entries():
    assert job_state({}) is None
    state = job_state({"lane_0": {"fingerprint": {"lanes": 1}}})
    assert read_state(state, "job").entries == {"lane_0": {"fingerprint": {"lanes": 1}}}
