"""Agreement between data-parallel ranks on how many rounds of microbatches all can deliver.

A round is the ``j``-th microbatch of every lane; rounds are grouped into *windows* (see
:mod:`zephon.engine.rank`). The run ends at the first round in which some lane has no
microbatch left, on every rank at once, so no rank waits in a collective for a peer that
stopped. One agreement is an element-wise MIN all-reduce of :data:`SPAN` int32 entries, one
per window from the first window not yet agreed: each rank writes how many of the window's
rounds it has complete, or :data:`UNKNOWN` (-1) when its producer has not made that window yet.
An entry is agreed when no rank wrote UNKNOWN; the agreed prefix is what every rank may hand out.

Cost model: at most one all-reduce of 16 bytes per window of up to 16 rounds, usually issued
asynchronously (``async_op=True``) one window ahead of need, so the consumer's thread only
issues it and later reads a result that has long arrived. It blocks the consumer only where
the consumer outruns its producer, and then it waits for data anyway. Over the default gloo
group it never touches a GPU; NCCL groups are refused (reading their result would synchronize
the device): pass a gloo group over the data-parallel ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from zephon.distributed import world_gloo_group
from zephon.errors import ConfigError

log = logging.getLogger(__name__)

SPAN = 4
"""Windows one agreement covers (entries of its vector)."""
UNKNOWN = -1
"""An entry a rank cannot fill yet: its producer has not made that window."""


class Pending:
    """The result of one agreement, read with :meth:`result` (waits if it has not arrived)."""

    __slots__ = ("_tensor", "_values", "_work")

    def __init__(self, values: list[int] | None = None, work: Any = None, tensor: Any = None):
        self._values, self._work, self._tensor = values, work, tensor

    def result(self) -> list[int]:
        if self._values is None:
            self._work.wait()
            self._values = [int(v) for v in self._tensor.tolist()]
            self._work = self._tensor = None
        return self._values


def check_agreement_group(process_group: Any) -> None:
    """Refuse a process group the agreement cannot use without a device synchronization."""
    if process_group is None:
        return
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    backend = str(dist.get_backend(process_group)).lower()
    if "gloo" not in backend:
        raise ConfigError(
            f"options: process_group uses the {backend} backend; the end-of-data agreement "
            "reads its result on the host, which on a GPU backend synchronizes the device. "
            "Pass a gloo group over the same ranks (for example "
            "torch.distributed.new_group(ranks, backend='gloo'), or Megatron's "
            "parallel_state.get_data_parallel_group_gloo()), or None for the whole world")


class RoundAgreement:
    """``start(first, entries) -> Pending`` of the element-wise minimum over the data-parallel
    group."""

    def __init__(self, world_size: int, process_group: Any = None):
        self.world_size = world_size
        self._group = process_group
        self._warned = False

    def start(self, first: int, entries: Sequence[int]) -> Pending:
        """Issue the agreement on windows ``first, first + 1, ...`` (``entries``: this rank's
        complete rounds in each, or UNKNOWN); it runs while the caller goes on."""
        if self.world_size == 1:
            return Pending(list(entries))
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return self._alone(entries)
        if not dist.is_available() or not dist.is_initialized():
            return self._alone(entries)
        if self._group is None:
            if dist.get_world_size() != self.world_size:
                return self._alone(entries, "the default process group has "
                                   f"{dist.get_world_size()} ranks, not dp_world_size="
                                   f"{self.world_size}; pass process_group=<the DP group>")
            self._group = world_gloo_group()
        tensor = torch.tensor(list(entries), dtype=torch.int32)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self._group, async_op=True)
        return Pending(work=work, tensor=tensor)

    def _alone(self, entries: Sequence[int], why: str = "torch.distributed is not initialized"
               ) -> Pending:
        if not self._warned:
            log.warning("zephon: %s, so ranks cannot agree on the end of data; each rank stops "
                        "when its own lanes run out", why)
            self._warned = True
        return Pending(list(entries))
