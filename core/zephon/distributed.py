"""Process groups the loader and its adapters share.

``world_gloo_group()`` is a gloo group over the whole default group, created once per process:
creating a group is a collective, so every pipeline (and every adapter) of a process must reuse
the same one rather than create its own.
"""

from __future__ import annotations

from typing import Any

_WORLD_GLOO: Any = None


def world_gloo_group() -> Any:
    """The process-wide gloo group over the default group (created on first use)."""
    global _WORLD_GLOO
    import torch.distributed as dist

    if _WORLD_GLOO is None:
        _WORLD_GLOO = dist.new_group(backend="gloo")
    return _WORLD_GLOO
