"""One rank of a job lists and plans the data; the others receive the listing and the units.

The opens of the data files, by every process, are counted with inotify
(:mod:`benchmarks.open_counter`): pyarrow opens files from C++, out of Python's sight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.open_counter import OpenCounter
from zephon.distributed import once_per_job
from zephon.io.formats import UnitSpec
from zephon.io.unit_table import UnitTable

FILES = 400

WORKER = r"""
import hashlib, json, sys
import numpy as np
import torch.distributed as dist
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

rank, world, store, data, tokenizer, out, per_rank = sys.argv[1:8]
rank, world, per_rank = int(rank), int(world), int(per_rank)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
source = StaticMixtureWorkSource([Dataset.from_path("web", data)], MixtureSpec({"web": 1.0}),
                                 seed=3)
pipeline = (Pipeline(source).options(lanes=8, dp_rank=rank, dp_world_size=world, prefetch=0)
            .tokenize(tokenizer_id=tokenizer).pack_flat(33).batch(2))
batches = {}
for batch in pipeline:
    ids = b"".join(np.asarray(r.payload["input_ids"]).tobytes() for r in batch.records)
    batches[f"{batch.lane}/{batch.index}"] = hashlib.sha256(ids).hexdigest()
    if len(batches) == per_rank:
        break
json.dump(batches, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("many") / "web"
    folder.mkdir()
    for i in range(FILES):
        texts = [f"file {i} document {j} " + "words of text " * (3 + (i + j) % 7)
                 for j in range(4)]
        pq.write_table(pa.table({"text": texts}), folder / f"part-{i:04d}.parquet")
    return folder


def _job(world: int, folder: Path, tokenizer: str, tmp: Path, per_rank: int
         ) -> tuple[int, dict[str, str]]:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    outs = [tmp / f"w{world}-rank{r}.json" for r in range(world)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    counter = OpenCounter(folder)
    try:
        procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world),
                                   str(tmp / f"store-{world}"), str(folder), tokenizer,
                                   str(outs[r]), str(per_rank)], env=env)
                 for r in range(world)]
        while any(p.poll() is None for p in procs):
            counter.drain()
            time.sleep(0.05)
        counter.drain()
    finally:
        counter.close()
    assert all(p.returncode == 0 for p in procs)
    batches: dict[str, str] = {}
    for out in outs:
        batches.update(json.loads(out.read_text()))
    return counter.opens, batches


@pytest.mark.multiprocess
def test_four_ranks_open_the_files_about_as_often_as_one_and_get_the_same_batches(
        many_files, tokenizer_dir, tmp_path):
    one_opens, one = _job(1, many_files, tokenizer_dir, tmp_path, per_rank=16)
    four_opens, four = _job(4, many_files, tokenizer_dir, tmp_path, per_rank=4)
    # the listing opens every file once and planning takes the footers from what it read
    assert FILES <= one_opens < 1.5 * FILES, one_opens
    assert four_opens <= 1.3 * one_opens, (four_opens, one_opens)
    assert len(one) == 16 and four == one  # the same microbatches of every lane


def test_without_a_job_each_process_computes_for_itself():
    calls = []
    assert once_per_job("k", lambda: calls.append(1) or b"v") == b"v"
    assert once_per_job("k", lambda: calls.append(1) or b"v") == b"v"
    assert calls == [1, 1]


def test_a_unit_table_round_trips_and_indexes_like_its_units():
    units = [(0, UnitSpec("row_group", 0, 0, 10)), (0, UnitSpec("row_group", 1, 0, 7)),
             (1, UnitSpec("rows", 0, 5, 9)), (2, UnitSpec("bytes", 0, 0, 4096)),
             (3, UnitSpec("file", 0, 0, -1))]
    table = UnitTable.from_units(units)
    assert list(table) == units and table[2] == units[2] and len(table) == 5
    again = UnitTable.from_bytes(table.to_bytes())
    assert again == table and again.digest() == table.digest()
    assert table.nbytes == 25 * len(units)
    assert table.rows() is None and UnitTable.from_units(units[:3]).rows() == 21
    with pytest.raises(Exception, match="cut short"):
        UnitTable.from_bytes(table.to_bytes()[:-3])
