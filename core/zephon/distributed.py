"""Process groups the loader and its adapters share.

``world_gloo_group()`` is a gloo group over the whole default group, created once per process:
creating a group is a collective, so every pipeline (and every adapter) of a process must reuse
the same one rather than create its own.

``once_per_job(key, compute)`` runs ``compute`` on one rank of the job and hands its bytes to
every other rank that asks for the same key, through the default group's key-value store:
the first rank to ask claims the key (an atomic ``add``), computes and publishes; the others
wait for the value. It is not a collective (ranks that never ask take no part), it needs no
device and works under any backend. The store holds the value for the rest of the job, so a
later request with the same key (a pipeline built again) gets it at once; keys must therefore
name everything the value depends on. A failure on the computing rank is published too, and
raised on every rank that waits, instead of leaving them waiting until the store's timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zlib
from collections.abc import Callable
from typing import Any

_WORLD_GLOO: Any = None


def world_gloo_group() -> Any:
    """The process-wide gloo group over the default group (created on first use)."""
    global _WORLD_GLOO
    import torch.distributed as dist

    if _WORLD_GLOO is None:
        _WORLD_GLOO = dist.new_group(backend="gloo")
    return _WORLD_GLOO


STORE_CHUNK = 4 << 20
"""Bytes per store value: the TCP store's server refuses a message over 8 MiB. A value is
compressed (zlib level 1: a listing of 100,000 files, 10 MB of JSON, becomes about 1 MB) and
sent in chunks of this size."""


def job_store() -> Any:
    """The default process group's key-value store when ``torch.distributed`` runs more than
    one rank, else None (torch is not imported for it)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if (dist is None or not dist.is_available() or not dist.is_initialized()
            or dist.get_world_size() <= 1):
        return None
    return dist.distributed_c10d._get_default_store()


def once_per_job(key: str, compute: Callable[[], bytes]) -> bytes:
    """``compute()`` on the first rank of the job that asks for ``key``, its bytes handed to
    every rank that asks (see the module docstring); without a multi-rank job, ``compute()``
    here. Errors raised by ``compute`` on the computing rank reach the waiting ranks as a
    ConfigError or DataError naming them."""
    from zephon.errors import ConfigError, DataError, ZephonError

    store = job_store()
    if store is None:
        return compute()
    name = "zephon/once/" + hashlib.sha256(key.encode()).hexdigest()[:32]
    if store.add(name + "/claim", 1) == 1:
        try:
            value = compute()
        except BaseException as exc:
            failure = {"error": str(exc) if isinstance(exc, ZephonError)
                       else f"{type(exc).__name__}: {exc}", "config": isinstance(exc, ConfigError)}
            store.set(name + "/error", json.dumps(failure))
            store.set(name, b"error")
            raise
        packed = zlib.compress(value, 1)
        chunks = [packed[i:i + STORE_CHUNK] for i in range(0, len(packed), STORE_CHUNK)]
        for index, chunk in enumerate(chunks):
            store.set(f"{name}/{index}", chunk)
        store.set(name, str(len(chunks)))  # last: a waiting rank then finds every chunk
        return value
    head = bytes(store.get(name))
    if head == b"error":
        failure = json.loads(store.get(name + "/error"))
        error = ConfigError if failure["config"] else DataError
        raise error(f"another rank failed at this step: {failure['error']}")
    return zlib.decompress(b"".join(bytes(store.get(f"{name}/{i}"))
                                    for i in range(int(head))))


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
