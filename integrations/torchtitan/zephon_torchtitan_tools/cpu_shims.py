"""CPU shims for smoke runs of TorchTitan 0.3.0: never imported by a GPU run.

TorchTitan 0.3.0 assumes an accelerator. This module patches exactly what stops a CPU run, in
the order a run meets it, and nothing else:

1. ``torchtitan.distributed.minimal_async_ep.kernels`` imports ``triton`` unconditionally (it
   is reached from the model code). A placeholder module takes its place; calling any of its
   kernels raises. A fake top-level ``triton`` would break torch's inductor, so only this
   one module is replaced.
2. ``torchtitan.tools.utils`` falls back to device type "cuda"; torch's available-device
   lookup is made to answer "cpu" before TorchTitan is imported.
3. ``torch.cpu`` lacks the memory/properties calls of TorchTitan's device memory monitor;
   they are added, reporting zeros.
4. FlexAttention refuses gradients on CPU ("does not support backward on CPU"): that is true
   of the inductor kernels, not of the eager reference path, whose backward is the dense
   math implementation. The compiled wrappers are replaced by the eager ``flex_attention``
   and ``create_block_mask`` (same masks, same maths), and the device check lets CPU
   tensors with gradients through.
5. After the first step TorchTitan shortens the process-group timeouts: its barrier passes
   ``device_ids=["cpu"]`` and ``torch.distributed.set_timeout`` is missing in torch 2.13.0.
   A plain barrier stands in, and the timeouts stay as they were.
6. gloo rejects ``ReduceOp.PREMUL_SUM``, which FSDP uses when TorchTitan disables its
   gradient division: FSDP modules are switched to plain-sum reductions, and
   :func:`apply_cpu_config` picks the ``partial_dtensor`` SPMD backend, which works on gloo.

Limits: the debug models only; no torch.compile, no CUDA graphs, no ``--debug.deterministic``
(it recompiles flex), no varlen attention (CUDA-only). Use :func:`install` before anything
imports ``torchtitan``; ``python -m zephon_torchtitan_tools.cpu_shims -m MODULE ARGS`` does that
and then runs ``MODULE`` (for example ``torchtitan.train``) as ``__main__``.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import types
import warnings
from typing import Any

log = logging.getLogger(__name__)

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


def install() -> None:
    """Apply the shims (idempotent). Must run before ``torchtitan`` is imported."""
    if installed():
        return
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError(
            "zephon_torchtitan_tools.cpu_shims.install() must run before torchtitan is imported "
            "(torchtitan.tools.utils has already chosen its device type)")
    import torch

    _stub_triton_kernels()
    _report_cpu_device(torch)
    _add_cpu_memory_api(torch)
    _force_sum_reduction(torch)
    _eager_flex_attention()
    _keep_timeouts(torch)
    log.info("zephon_torchtitan: CPU shims installed (smoke runs only)")


def installed() -> bool:
    """Whether this process runs with the shims (a marker on torch, not a module global, so
    that running this file as ``__main__`` and importing it agree)."""
    import torch._utils as tutils

    return getattr(tutils._get_available_device_type, "_zephon_cpu_shim", False)


def apply_cpu_config(config: Any) -> None:
    """Settings a TorchTitan ``Trainer.Config`` needs on CPU (changed in place)."""
    config.parallelism.spmd_backend = "partial_dtensor"
    config.training.disable_cuda_graphs = True
    config.compile.enable = False
    config.debug.deterministic = False


def _stub_triton_kernels() -> None:
    module = types.ModuleType(_KERNELS)
    module.__doc__ = ("Placeholder installed by zephon_torchtitan_tools.cpu_shims (no triton "
                      "on CPU).")

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{_KERNELS}.{name} needs triton and CUDA; this is a CPU run")

        return unavailable

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    sys.modules[_KERNELS] = module


def _report_cpu_device(torch: Any) -> None:
    import torch._utils as tutils

    original = tutils._get_available_device_type

    def available_device_type() -> str:
        return original() or "cpu"

    available_device_type._zephon_cpu_shim = True  # type: ignore[attr-defined]
    tutils._get_available_device_type = available_device_type


def _add_cpu_memory_api(torch: Any) -> None:
    cpu = torch.cpu
    properties = types.SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE")
                                       * os.sysconf("SC_PHYS_PAGES"), name="cpu")
    defaults = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: properties,
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {},
    }
    for name, fn in defaults.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)


def _keep_timeouts(torch: Any) -> None:
    from torchtitan.distributed import utils as dist_utils

    def set_pg_timeouts(timeout: Any, parallel_dims: Any) -> None:
        torch.distributed.barrier()

    dist_utils.set_pg_timeouts = set_pg_timeouts


def _force_sum_reduction(torch: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    original = FSDPModule.set_gradient_divide_factor
    if getattr(original, "_zephon_cpu_shim", False):
        return

    def set_gradient_divide_factor(self: Any, factor: float) -> None:
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    set_gradient_divide_factor._zephon_cpu_shim = True  # type: ignore[attr-defined]
    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def _eager_flex_attention() -> None:
    import torch.nn.attention.flex_attention as flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common import attention

    attention.FlexAttention._compiled_flex_attn = staticmethod(flex_attention)
    attention._compiled_create_block_mask = create_block_mask
    check = flex._validate_device

    def validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type != "cpu":
            check(query, key, value)

    flex._validate_device = validate_device
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


def main(argv: list[str] | None = None) -> None:
    """``python -m zephon_torchtitan_tools.cpu_shims -m MODULE [ARGS...]``: shims, then MODULE."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit("usage: python -m zephon_torchtitan_tools.cpu_shims -m MODULE [ARGS...]")
    module = argv[1]
    from zephon.distributed import single_process_env
    from zephon_torchtitan_tools import cpu_shims

    cpu_shims.install()
    single_process_env()  # without torchrun: one process
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
