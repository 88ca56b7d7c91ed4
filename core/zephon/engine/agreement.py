"""Agreement between data-parallel ranks on whether a round of microbatches is complete.

A round is the ``j``-th microbatch of every lane. The run ends at the first round in which some
lane has no microbatch left, on every rank at once, so no rank waits in a collective for a peer
that stopped. With one rank no communication is needed; with several, each round costs one
all-reduce of one integer over a gloo group (about 0.1 ms on a node), or over the given
process group on its own device when that group is NCCL.
"""

from __future__ import annotations

import logging
from typing import Any

from zephon.distributed import world_gloo_group

log = logging.getLogger(__name__)


class RoundAgreement:
    """``agree(local_ok) -> global_ok`` over the data-parallel group."""

    def __init__(self, world_size: int, process_group: Any = None):
        self.world_size = world_size
        self._group = process_group
        self._warned = False

    def __call__(self, local_ok: bool) -> bool:
        if self.world_size == 1:
            return local_ok
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return self._alone(local_ok)
        if not dist.is_available() or not dist.is_initialized():
            return self._alone(local_ok)
        if self._group is None:
            if dist.get_world_size() != self.world_size:
                return self._alone(local_ok, "the default process group has "
                                   f"{dist.get_world_size()} ranks, not dp_world_size="
                                   f"{self.world_size}; pass process_group=<the DP group>")
            self._group = world_gloo_group()
        device = "cpu"
        if dist.get_backend(self._group) == "nccl":  # a DP group without a gloo twin
            device = f"cuda:{torch.cuda.current_device()}"
        flag = torch.tensor([1 if local_ok else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flag.item())

    def _alone(self, local_ok: bool, why: str = "torch.distributed is not initialized") -> bool:
        if not self._warned:
            log.warning("zephon: %s, so ranks cannot agree on the end of data; each rank stops "
                        "when its own lanes run out", why)
            self._warned = True
        return local_ok
