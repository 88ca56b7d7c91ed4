"""Tensor-parallel peers under a real process group: same data, same batch count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zephon.demo.assets import make_documents
from zephon.distributed import launcher_store

# One process of a 2 (data-parallel) x 2 (tensor-parallel) mesh. torchrun's variables are set
# as for any rank; TorchTitan passes the batch mesh's rank, which TP peers share.
WORKER = r"""
import hashlib, json, os, sys
import torch.distributed as dist
from zephon_torchtitan_tools import cpu_shims
cpu_shims.install()
from zephon_torchtitan.dataloader import ZephonDataLoader

rank, recipe, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
dist.init_process_group("gloo")  # env://: the launcher's store
loader = ZephonDataLoader.Config(recipe=recipe).build(
    dp_world_size=2, dp_rank=rank // 2, tokenizer=None, seq_len=32, local_batch_size=2)
digests = []
for inputs, labels in loader:
    digests.append(hashlib.sha256(inputs["input"].numpy().tobytes()
                                  + labels.numpy().tobytes()).hexdigest()[:16])
    dist.barrier()  # a collective per step over the whole mesh, as the trainer has
json.dump(digests, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_tensor_parallel_peers_get_identical_batches_and_stop_together(docs_dir, tmp_path,
                                                                      recipes):
    texts = make_documents(40, seed=11, min_words=10, max_words=120)
    recipe = recipes.write(tmp_path / "mesh.toml", lanes=4, datasets=(
        f'[[datasets]]\nname = "docs"\npath = "{docs_dir(texts)}"\n'))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    _store, rendezvous = launcher_store(4)  # held until the ranks exit
    outs = [tmp_path / f"rank{r}.json" for r in range(4)]
    env = {**os.environ, **rendezvous, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(recipe),
                               str(outs[r])], env=env) for r in range(4)]
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    batches = [json.loads(p.read_text()) for p in outs]
    assert batches[0] == batches[1] and batches[2] == batches[3]
    assert len(batches[0]) == len(batches[2]) > 2
    assert not set(batches[0]) & set(batches[2])
