"""Ranks a launcher starts rendezvous through the launcher's store: no port is picked free and
released for another process to take first."""

from __future__ import annotations

import os
import subprocess
import sys

RANK = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(int(total.item()))
dist.destroy_process_group()
"""


def test_ranks_join_the_launchers_store():
    from zephon.distributed import launcher_store

    launches = [launcher_store(3) for _ in range(2)]  # two launches at once, two ports
    assert launches[0][1]["MASTER_PORT"] != launches[1][1]["MASTER_PORT"]
    procs = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **env, "RANK": str(rank)})
             for _store, env in launches for rank in range(3)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6 and outputs == ["6"] * 6


def test_a_single_process_launch_lets_torch_pick_the_port(monkeypatch):
    from zephon.distributed import single_process_env

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    single_process_env()
    assert os.environ["MASTER_PORT"] == "0" and os.environ["WORLD_SIZE"] == "1"
