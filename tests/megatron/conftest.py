"""Fixtures for the Megatron adapter tests: a CPU megatron-core in the test process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The suite imports test files in importlib mode; the helpers module sits beside them.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def megatron_cpu() -> Iterator[None]:
    """A one-process gloo group, megatron-core's parallel state and the CPU shims."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from zephon_megatron_tools import cpu_shims

    owns_group = not dist.is_initialized()
    if owns_group:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = "0"  # this process hosts the store: the kernel picks
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    cpu_shims.install(1234)
    yield
    parallel_state.destroy_model_parallel()
    if owns_group:
        dist.destroy_process_group()
