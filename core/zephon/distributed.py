"""Process groups the loader and its adapters share.

``world_gloo_group()`` is a gloo group over the whole default group, created once per process:
creating a group is a collective, so every pipeline (and every adapter) of a process must reuse
the same one rather than create its own.
"""

from __future__ import annotations

import os
from typing import Any

_WORLD_GLOO: Any = None


def world_gloo_group() -> Any:
    """The process-wide gloo group over the default group (created on first use)."""
    global _WORLD_GLOO
    import torch.distributed as dist

    if _WORLD_GLOO is None:
        _WORLD_GLOO = dist.new_group(backend="gloo")
    return _WORLD_GLOO


def launcher_store(world_size: int) -> tuple[Any, dict[str, str]]:
    """A rendezvous store for the ``world_size`` ranks a launcher starts on this machine, and
    the environment variables that make them use it.

    The launcher hosts the store on a port the kernel picks, as torchrun hosts its agent's:
    ranks started with the variables (``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_USE_AGENT_STORE=True``) join it as clients when they call
    ``init_process_group`` (``env://``). Picking a free port, releasing it and letting rank 0
    bind it later races with every other process of the machine (EADDRINUSE when two launches
    start together); this cannot. Keep the store alive until the ranks have exited."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size=world_size, is_master=True,
                     wait_for_workers=False, timeout=timedelta(minutes=10))
    return store, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                   "WORLD_SIZE": str(world_size), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def single_process_env() -> None:
    """Without a launcher, the rendezvous variables of a one-process run (RANK=0,
    WORLD_SIZE=1, LOCAL_RANK=0, MASTER_PORT=0 on 127.0.0.1: the one process hosts the store on
    a port the kernel picks, so two launches never race for one); set ones are left alone."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "0")):
        os.environ.setdefault(key, value)
