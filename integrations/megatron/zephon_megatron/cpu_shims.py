"""CPU-only shims for megatron-core 0.16.1: the one place where the adapter bends Megatron.

Megatron runs on GPUs; the adapter's tests and ``make smoke-megatron`` run megatron-core's real
GPTModel and DistributedDataParallel on CPU instead. Three megatron-core modules allocate on
``torch.cuda.current_device()`` unconditionally in the forward/backward path, and the RNG
tracker that dropout forks inside attention saves and restores CUDA generator state:

- ``models.common.embeddings.rotary_pos_embedding`` (RoPE frequencies moved to the device),
- ``utils`` (``GlobalMemoryBuffer``: the attention score buffer),
- ``distributed.param_and_grad_buffer`` (DDP's contiguous parameter/gradient buffers).

The shim gives each of those modules its own view of ``torch`` in which ``torch.cuda`` reports
the CPU as the current device; ``torch`` itself and every other module are left untouched. The
RNG tracker is replaced by :class:`CpuRngTracker`, which forks the CPU generator per named
state, so dropout stays seeded and reproducible.

Limits: only what the local (non Transformer Engine) layer spec, megatron-core DDP with
``overlap_grad_reduce=False`` and a plain torch optimizer touch is covered. Megatron's own
optimizer wrapper, the pipeline schedules and Megatron-LM's ``pretrain()`` still need CUDA.
:func:`install` refuses to run where CUDA is available, so a GPU job never trains on shims.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Iterator
from typing import Any

import torch

SHIMMED_MODULES = (
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.utils",
    "megatron.core.distributed.param_and_grad_buffer",
)

_installed = False


class _CpuCuda(types.ModuleType):
    """``torch.cuda`` as seen by a shimmed module: the current device is the CPU."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def current_stream() -> _CpuStream:
        return _CpuStream()


class _CpuStream:
    """The one CPU "stream": work is already ordered, so waiting is a no-op (megatron-core
    0.19's gradient buffers wait on the current stream before reducing)."""

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass


class _TorchOnCpu(types.ModuleType):
    """``torch`` as seen by a shimmed module; everything but ``cuda`` is the real torch."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class CpuRngTracker:
    """Named CPU generator states with megatron-core's tracker interface (add/fork/...)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"CpuRngTracker: seed {seed} is already used")
        if name in self.states_:
            raise ValueError(f"CpuRngTracker: state {name!r} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"CpuRngTracker: state {name!r} was never added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def install(seed: int = 1234) -> CpuRngTracker:
    """Apply the shims (idempotent) and seed a fresh RNG tracker; returns the tracker.

    Call after ``parallel_state.initialize_model_parallel`` and before building the model,
    where a GPU job would call ``model_parallel_cuda_manual_seed``.
    """
    global _installed
    if torch.cuda.is_available():
        raise RuntimeError("zephon_megatron.cpu_shims is for CPU-only runs; CUDA is available "
                           "here, so use megatron-core unpatched")
    if not _installed:
        for name in SHIMMED_MODULES:
            module = importlib.import_module(name)
            module.torch = _TorchOnCpu()  # type: ignore[attr-defined]
        _installed = True
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random

    tracker = CpuRngTracker()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    torch.manual_seed(seed)
    tracker.add("data-parallel-rng", seed)
    tracker.add("model-parallel-rng", seed + 2718 + tp_rank)
    tracker.add("expert-parallel-rng", seed + 1024 + 100 * tp_rank + 1)
    tp_random._CUDA_RNG_STATE_TRACKER = tracker
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return tracker
