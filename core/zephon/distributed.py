"""Process groups the loader and its adapters share.

``world_gloo_group()`` is a gloo group over the whole default group, created once per process:
creating a group is a collective, so every pipeline (and every adapter) of a process must reuse
the same one rather than create its own.

Start-up (:func:`startup`): a pipeline's runtime is built on every rank at once, and ranks
wait for one another there (a listing one rank makes for all, the rank check). A rank whose
start-up fails publishes its error in the store under that start-up's tag, and every wait of
its peers looks for it: they fail at once naming the rank and its error, instead of waiting in
a collective until the process group's timeout. A peer that neither arrives nor fails (killed,
hung) is named when :data:`STARTUP_TIMEOUT_S` (``LoaderOptions.startup_timeout_s``) has passed.
Start-ups are tagged by their order in the process (the first, the second, ...), which is the
same on every rank of an SPMD job, as the order of its collectives is.

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

import contextlib
import hashlib
import itertools
import json
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zephon.errors import ConfigError, DataError, ZephonError

_WORLD_GLOO: Any = None


def world_gloo_group() -> Any:
    """The process-wide gloo group over the default group (created on first use)."""
    global _WORLD_GLOO
    import torch.distributed as dist

    if _WORLD_GLOO is None:
        # Creating a group is a collective: at start-up, meet the peers in the store first.
        arrive(range(dist.get_world_size()), "zephon's process group")
        _WORLD_GLOO = dist.new_group(backend="gloo")
    return _WORLD_GLOO


def gather_json(value: Any, group: Any) -> list[Any]:
    """``value`` (plain data: what ``json.dumps`` takes) from every rank of ``group``, in rank
    order. A collective of two all-gathers over the (gloo) group, the lengths then the bytes
    padded to the longest; no pickle is sent or loaded, so what a peer sends is data, which
    the caller checks like any state read back."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    data = json.dumps(value, separators=(",", ":")).encode()
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64), group=group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    if data:
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(parts, mine, group=group)
    return [json.loads(part[:int(n.item())].numpy().tobytes())
            for part, n in zip(parts, lengths, strict=True)]


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


STARTUP_TIMEOUT_S = 1800.0
"""How long a rank waits at start-up for a peer that neither arrives nor fails (the default of
``LoaderOptions.startup_timeout_s``): torch's own default for a process group's collectives."""
_POLL_S = (0.01, 0.5)
"""A start-up wait asks the store first after 10 ms, then ever less often, at most every
half second: at most two requests a second per waiting rank."""

_STARTUPS = itertools.count()
_local = threading.local()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


@contextlib.contextmanager
def startup(timeout: float | None = None) -> Iterator[None]:
    """The enclosed code is this rank's part of a start-up every rank runs (see the module
    docstring): a failure inside is published to the peers before it propagates, and the
    waits inside (:func:`once_per_job`, :func:`arrive`) fail when a peer's start-up failed,
    or when one has not arrived after ``timeout`` seconds (None: :data:`STARTUP_TIMEOUT_S`).
    A nested start-up is part of the outermost one; a timeout it gives applies from there
    on."""
    if getattr(_local, "tag", None) is not None:
        if timeout is not None:
            _local.timeout = timeout
        yield
        return
    if job_store() is None:
        yield
        return
    _local.tag = f"zephon/startup/{next(_STARTUPS)}"
    _local.timeout = STARTUP_TIMEOUT_S if timeout is None else timeout
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, PeerFailed):
            _publish_failure(_local.tag, exc)
        raise
    finally:
        _local.tag = None


class PeerFailed(ZephonError):
    """Raised because another rank's start-up failed (not published again)."""


class PeerConfigError(PeerFailed, ConfigError):
    """Another rank's start-up failed with a ConfigError."""


class PeerDataError(PeerFailed, DataError):
    """Another rank's start-up failed with a DataError or another exception."""


def _publish_failure(tag: str, exc: BaseException) -> None:
    store = job_store()
    if store is None:
        return
    message = str(exc) if isinstance(exc, ZephonError) else f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):  # the store itself may be what failed
        store.set(f"{tag}/failed/{_rank()}", json.dumps(
            {"error": message, "config": isinstance(exc, ConfigError)}))
        store.add(f"{tag}/failures", 1)


def _peer_failure(store: Any, tag: str, ranks: Sequence[int]) -> BaseException | None:
    """The error of the first peer whose start-up ``tag`` failed, or None."""
    if store.add(f"{tag}/failures", 0) == 0:
        return None
    for rank in ranks:
        key = f"{tag}/failed/{rank}"
        if store.check([key]):
            failure = json.loads(store.get(key))
            error = PeerConfigError if failure["config"] else PeerDataError
            return error(f"rank {rank} failed at start-up: {failure['error']}")
    return None


def _wait(store: Any, done: Callable[[], bool], ranks: Sequence[int],
          late: Callable[[], str]) -> None:
    """Until ``done()``, polling the store (see :data:`_POLL_S`); raises the error of a peer
    whose start-up failed, or, after the start-up's timeout, a ConfigError saying
    ``late()``."""
    tag = getattr(_local, "tag", None)
    timeout = getattr(_local, "timeout", STARTUP_TIMEOUT_S) if tag is not None \
        else STARTUP_TIMEOUT_S
    deadline = time.monotonic() + timeout
    pause = _POLL_S[0]
    while not done():
        if tag is not None:
            failure = _peer_failure(store, tag, ranks)
            if failure is not None:
                raise failure
        if time.monotonic() >= deadline:
            raise ConfigError(f"{late()} within {timeout:.0f} s of start-up "
                              "(LoaderOptions.startup_timeout_s, a recipe's "
                              "startup_timeout_s)")
        time.sleep(pause)
        pause = min(_POLL_S[1], pause * 2)


def arrive(group_ranks: Sequence[int], where: str) -> None:
    """Wait until every rank of ``group_ranks`` (global ranks) has arrived at ``where`` (a
    collective over them) in this start-up; raises naming a peer whose start-up failed, or
    the ranks that have not arrived by the timeout. Outside a start-up, or without a
    multi-rank job, returns at once."""
    store, tag = job_store(), getattr(_local, "tag", None)
    if store is None or tag is None:
        return
    group_ranks = list(group_ranks)
    point = f"{tag}/{hashlib.sha256(where.encode()).hexdigest()[:8]}"
    store.set(f"{point}/arrived/{_rank()}", "1")
    keys = [f"{point}/arrived/{rank}" for rank in group_ranks]

    def missing() -> list[int]:
        return [r for r, key in zip(group_ranks, keys, strict=True) if not store.check([key])]

    _wait(store, lambda: store.check(keys), group_ranks,
          lambda: f"rank(s) {missing()} did not reach {where}")


def first_rank() -> bool:
    """Whether this process is rank 0 of the job, or runs without one: where a message the
    whole job shares is logged once."""
    return job_store() is None or _rank() == 0


def once_per_job(key: str, compute: Callable[[], bytes]) -> bytes:
    """``compute()`` on the first rank of the job that asks for ``key``, its bytes handed to
    every rank that asks (see the module docstring); without a multi-rank job, ``compute()``
    here. Errors raised by ``compute`` on the computing rank reach the waiting ranks as a
    ConfigError or DataError naming them."""
    store = job_store()
    if store is None:
        return compute()
    name = "zephon/once/" + hashlib.sha256(key.encode()).hexdigest()[:32]
    if store.add(name + "/claim", 1) == 1:
        store.set(name + "/by", str(_rank()))
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
    import torch.distributed as dist

    def claimer() -> str:
        return bytes(store.get(name + "/by")).decode() if store.check([name + "/by"]) else "?"

    _wait(store, lambda: store.check([name]), range(dist.get_world_size()),
          lambda: f"rank {claimer()} did not publish what it computes for all ranks "
                  f"({key.split('/')[0]})")
    head = bytes(store.get(name))
    if head == b"error":
        failure = json.loads(store.get(name + "/error"))
        error = PeerConfigError if failure["config"] else PeerDataError
        raise error(f"rank {claimer()} failed at start-up: {failure['error']}")
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
