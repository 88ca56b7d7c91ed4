"""Agreement between data-parallel ranks on how many rounds of microbatches all can deliver.

A round is the ``j``-th microbatch of every lane. The run ends at the first round in which some
lane has no microbatch left, on every rank at once, so no rank waits in a collective for a peer
that stopped. Ranks agree per *window* of rounds (see :mod:`zephon.engine.rank`): each says how
many of the window's rounds it has complete, and the minimum is what every rank hands out.

Cost model: windows of 1, 2, 4, 8 and then 16 rounds, so N rounds cost about ``N / 16 + 4``
all-reduces of one int32 (4 bytes) on the consumer's thread, where the producer thread has the
window's rounds ready (with ``prefetch=0``, a window is one round). It runs on the consumer's
thread on purpose: a rank whose trainer stops never leaves its peers waiting in a collective
its producer had started. Over a gloo group (the default) it costs about 0.1 ms on a node and
never touches a GPU; over a given NCCL group it runs on the group's device and reading its
result synchronizes that device, once per window: pass a gloo group.
"""

from __future__ import annotations

import logging
from typing import Any

from zephon.distributed import world_gloo_group

log = logging.getLogger(__name__)


class RoundAgreement:
    """``agree(local_rounds) -> the minimum over the data-parallel group``."""

    def __init__(self, world_size: int, process_group: Any = None):
        self.world_size = world_size
        self._group = process_group
        self._warned = False

    def __call__(self, local_rounds: int) -> int:
        if self.world_size == 1:
            return local_rounds
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return self._alone(local_rounds)
        if not dist.is_available() or not dist.is_initialized():
            return self._alone(local_rounds)
        if self._group is None:
            if dist.get_world_size() != self.world_size:
                return self._alone(local_rounds, "the default process group has "
                                   f"{dist.get_world_size()} ranks, not dp_world_size="
                                   f"{self.world_size}; pass process_group=<the DP group>")
            self._group = world_gloo_group()
        device = "cpu"
        if dist.get_backend(self._group) == "nccl":  # a DP group without a gloo twin
            device = f"cuda:{torch.cuda.current_device()}"
        count = torch.tensor([local_rounds], dtype=torch.int32, device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MIN, group=self._group)
        return int(count.item())

    def _alone(self, local_rounds: int, why: str = "torch.distributed is not initialized"
               ) -> int:
        if not self._warned:
            log.warning("zephon: %s, so ranks cannot agree on the end of data; each rank stops "
                        "when its own lanes run out", why)
            self._warned = True
        return local_rounds
