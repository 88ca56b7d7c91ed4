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

Limits of :func:`install`: only what the local (non Transformer Engine) layer spec,
megatron-core DDP with ``overlap_grad_reduce=False`` and a plain torch optimizer touch.

:func:`install_for_pretrain` goes further, for Megatron-LM's own ``pretrain()`` (initialize,
training loop, evaluation, Megatron's optimizer wrapper, checkpoints; see
:mod:`zephon_megatron_tools.cpu_pretrain`). The same rule holds: a module in :data:`PRETRAIN_SHIMS`
gets its own ``torch`` view in which only the listed ``torch.cuda`` names are replaced (every
other CUDA call still fails loudly), and, for modules in :data:`PRETRAIN_DEVICE_REMAP`, tensor
factories given ``device="cuda"`` allocate on the CPU. Megatron's own RNG tracker runs with the
CPU generator as its "CUDA" generator, so checkpoints save and restore it. Tensor parallelism
runs (tested at TP=2). Not covered: bf16 and fp16, the distributed optimizer, overlapped
gradient reduction, pipeline parallelism, Transformer Engine. Both functions refuse to run
where CUDA is available, so a GPU job never trains on shims.
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

    def synchronize(self) -> None:
        pass

    def record_event(self, *args: Any) -> None:
        return None


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
        raise RuntimeError("zephon_megatron_tools.cpu_shims is for CPU-only runs; CUDA is "
                           "available here, so use megatron-core unpatched")
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


# -- Megatron-LM pretrain() on CPU -------------------------------------------------------------
CPU = torch.device("cpu")


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


CUDA_STAND_INS: dict[str, Any] = {
    "is_available": lambda: True,  # initialize_megatron asserts it
    "device_count": lambda: 1,  # with 0 the model-parallel groups and RNG tracker are skipped
    "current_device": lambda: CPU,
    "set_device": _noop,
    "synchronize": _noop,
    "empty_cache": _noop,
    "Stream": lambda *args, **kwargs: _CpuStream(),
    "current_stream": lambda *args, **kwargs: _CpuStream(),
    "stream": lambda *args, **kwargs: contextlib.nullcontext(),
    "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
    "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
    "manual_seed": lambda seed: torch.manual_seed(seed),
    "default_generators": (torch.default_generator,),
    "random": types.SimpleNamespace(get_rng_state=lambda *a, **k: torch.get_rng_state()),
}

PRETRAIN_SHIMS: dict[str, tuple[str, ...]] = {
    # initialize_megatron: CUDA asserted, device count, set_device, JIT warm-up cache
    "megatron.training.initialize": ("is_available", "device_count", "set_device",
                                     "empty_cache"),
    # get_model (model.cuda(current_device)), the side stream around DDP construction
    "megatron.training.training": ("current_device", "Stream", "current_stream", "stream"),
    # 0.19 moved get_model's device placement and DDP wrapping here
    "megatron.training.models.dist_utils": ("current_device", "Stream", "current_stream",
                                            "stream"),
    "megatron.core.timers": ("synchronize", "current_device"),
    # --rerun-mode validate_results saves the RNG state before every step
    "megatron.core.rerun_state_machine": ("get_rng_state",),
    "megatron.training.utils": ("current_device",),
    "megatron.training.utils.common_utils": ("current_device",),  # 0.19's megatron.training.utils
    # the "CUDA" RNG state saved into and restored from checkpoints
    "megatron.training.checkpointing": ("get_rng_state", "set_rng_state", "empty_cache"),
    # Megatron's CudaRNGStatesTracker; _set_cuda_rng_state indexes default_generators by
    # current_device(), hence 0 there (below)
    "megatron.core.tensor_parallel.random": ("get_rng_state", "manual_seed", "random",
                                             "default_generators", "current_device"),
    "megatron.core.utils": ("current_device",),
    "megatron.core.distributed.param_and_grad_buffer": ("current_device", "current_stream"),
    "megatron.core.models.common.embeddings.rotary_pos_embedding": ("current_device",),
    # --ckpt-format torch_dist (Megatron's default): synchronize before writing, a failure
    # flag reduced on current_device()
    "megatron.core.dist_checkpointing.strategies.filesystem_async": ("synchronize",),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": ("current_device",),
}
PRETRAIN_OVERRIDES: dict[str, dict[str, Any]] = {
    "megatron.core.tensor_parallel.random": {"current_device": lambda: 0},
}
PRETRAIN_DEVICE_REMAP = frozenset({
    "megatron.training.initialize",  # _warmup_jit_function
    "megatron.training.training",  # start-time all-reduce, evaluation and flag tensors
    "megatron.training.utils",
    "megatron.training.utils.common_utils",
    "megatron.training.checkpointing",  # the iteration all-reduce of read_metadata
    "megatron.core.optimizer.optimizer",  # FP32Optimizer scale and found-inf buffers
    "megatron.core.optimizer.clip_grads",  # grad-norm buffers
    "megatron.core.rerun_state_machine",
    "megatron.core.utils",  # local_multi_tensor_l2_norm (no Apex or TE)
    "megatron.core.pipeline_parallel.schedules",  # the token counter
})
# Modules that call torch.tensor([...]).cuda() (evaluate()): a Tensor method no module view can
# redirect, so tensors made there get an instance-level no-op .cuda().
PRETRAIN_TENSOR_CUDA_NOOP = frozenset({"megatron.training.training"})
_FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
                        "arange", "as_tensor", "zeros_like", "ones_like", "empty_like",
                        "full_like"})


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class _CudaView(types.ModuleType):
    """``torch.cuda`` for one module: the listed names stand in, the rest are real."""

    def __init__(self, names: tuple[str, ...], overrides: dict[str, Any]) -> None:
        super().__init__("torch.cuda")
        self._stand_ins = {name: overrides.get(name, CUDA_STAND_INS[name]) for name in names}

    def __getattr__(self, name: str) -> Any:
        if name in self._stand_ins:
            return self._stand_ins[name]
        return getattr(torch.cuda, name)


class _TorchView(types.ModuleType):
    """``torch`` for one module: its own ``cuda``; factories may map CUDA to the CPU."""

    def __init__(self, names: tuple[str, ...], overrides: dict[str, Any], remap: bool,
                 tensor_cuda_noop: bool) -> None:
        super().__init__("torch")
        self.cuda = _CudaView(names, overrides)
        self._remap = remap
        self._tensor_cuda_noop = tensor_cuda_noop

    def __getattr__(self, name: str) -> Any:
        real = getattr(torch, name)
        if name in _FACTORIES and (self._remap or (self._tensor_cuda_noop
                                                   and name == "tensor")):
            return self._factory(real, name)
        return real

    def _factory(self, real: Any, name: str) -> Any:
        remap, noop = self._remap, self._tensor_cuda_noop and name == "tensor"

        def make(*args: Any, **kwargs: Any) -> Any:
            if remap and _is_cuda(kwargs.get("device")):
                kwargs["device"] = CPU
            out = real(*args, **kwargs)
            if noop and kwargs.get("device") is None:
                out.cuda = lambda *a, **k: out
            return out

        return make


def _clip_grad_by_total_norm_fp32(parameters: Any, max_norm: float, total_norm: float,
                                  use_decoupled_grad: bool = False) -> None:
    """megatron-core's clip_grad_by_total_norm_fp32 with its ``grad.type() ==
    'torch.cuda.FloatTensor'`` assertion (a Tensor method) checked as fp32 on the CPU."""
    from megatron.core.optimizer import clip_grads

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attribute = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = []
    for param in parameters:
        grad = getattr(param, attribute, None)
        if grad is not None:
            if grad.dtype != torch.float32:
                raise RuntimeError("cpu_shims: gradient clipping on CPU covers fp32 only")
            grads.append(clip_grads.to_local_if_dtensor(grad).detach())
    coefficient = max_norm / (total_norm + 1.0e-6)
    if coefficient < 1.0 and grads:
        overflow = torch.zeros(1, dtype=torch.int)
        clip_grads.multi_tensor_applier(clip_grads.multi_tensor_scale_impl, overflow,
                                        [grads, grads], coefficient)


_MODULE_GLOBALS: dict[str, dict[str, Any]] = {
    # fused kernels are built with nvcc; the dataset C++ helpers serve Megatron's GPTDataset,
    # which --dataloader zephon does not use
    "megatron.training.initialize": {
        "fused_kernels": types.SimpleNamespace(load=lambda args: None),
        "_compile_dependencies": lambda: None},
    # ``from torch.cuda import _lazy_call`` queues work until a CUDA init that never comes
    "megatron.core.tensor_parallel.random": {"_lazy_call": lambda callback, **kw: callback()},
    "megatron.core.optimizer.optimizer": {
        "clip_grad_by_total_norm_fp32": _clip_grad_by_total_norm_fp32},
    # 0.19's argument checks ask the GPU's compute capability whenever TP > 1; a CPU has none
    # (the launcher sets the CUDA_DEVICE_MAX_CONNECTIONS=1 that pre-Blackwell GPUs need)
    "megatron.training.arguments": {"get_device_arch_version": lambda: 0},
}
_pretrain_installed = False


def _import_if_present(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None  # a module this megatron-core version does not have


def install_for_pretrain() -> None:
    """Apply the shims Megatron-LM's ``pretrain()`` needs on CPU (idempotent); call before
    ``pretrain()``. Megatron's flags must ask for a CPU run: see
    :data:`zephon_megatron_tools.cpu_pretrain.CPU_FLAGS`."""
    global _pretrain_installed
    if torch.cuda.is_available():
        raise RuntimeError("zephon_megatron_tools.cpu_shims is for CPU-only runs; CUDA is "
                           "available here, so use Megatron-LM unpatched")
    if _pretrain_installed:
        return
    names = set(PRETRAIN_SHIMS) | PRETRAIN_DEVICE_REMAP | PRETRAIN_TENSOR_CUDA_NOOP
    for name in sorted(names):
        module = _import_if_present(name)
        if module is None or not isinstance(getattr(module, "torch", None), types.ModuleType):
            continue
        module.torch = _TorchView(PRETRAIN_SHIMS.get(name, ()),  # type: ignore[attr-defined]
                                  PRETRAIN_OVERRIDES.get(name, {}),
                                  name in PRETRAIN_DEVICE_REMAP,
                                  name in PRETRAIN_TENSOR_CUDA_NOOP)
    from megatron.core.transformer.module import MegatronModule

    # get_model moves every model chunk with .cuda(current_device()); they are built on the
    # CPU (--use-cpu-initialization) and stay there.
    MegatronModule.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    for name, replacements in _MODULE_GLOBALS.items():
        module = _import_if_present(name)
        for attribute, value in replacements.items():
            if module is not None and hasattr(module, attribute):
                setattr(module, attribute, value)
    # With the CPU generator standing in for the CUDA one, the tracker's fork() sees the CPU
    # state change inside every fork and logs it; that message says nothing here.
    import logging

    logging.getLogger("megatron.core.tensor_parallel.random").addFilter(
        lambda record: "CPU RNG state changed within GPU RNG context" not in record.getMessage())
    _pretrain_installed = True
