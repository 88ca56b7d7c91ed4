"""Agreement between data-parallel ranks on how many rounds of microbatches all can deliver.

A round is the ``j``-th microbatch of every lane. The rounds end at the first round in which
some lane has no microbatch left, on every rank at once, so no rank waits in a collective for a
peer that stopped (the last round, :mod:`zephon.engine.last_round`, needs no agreement: every
rank knows its length). One agreement is a MIN all-reduce of two int64 values per rank:

- ``made``: the rounds this rank's producer has complete so far (counted from the round the
  iterator started at);
- ``final``: ``made`` once this rank's data has ended (its next round is incomplete), else
  :data:`OPEN`.

The result is the *horizon* ``min(made)``: rounds below it exist on every rank and may be
handed out. When ``min(final)`` equals the horizon the end is known: some rank's data ends
right there and every other rank has made at least that many rounds. (``min(final)`` is never
below the horizon, since a rank that ended reports ``final == made``.)

Cost model: one all-reduce of 16 bytes each time the consumer catches up with the horizon,
issued asynchronously (``async_op=True``) halfway through the rounds the previous result
granted, so its latency hides behind those rounds of training. Where the producers keep ``R``
rounds ahead, each result grants about ``2R/3`` rounds (the producers' lead when it was issued,
less the half already handed out): one agreement per 43 rounds with the default 64 rounds of
read-ahead, one per 3 rounds with 4 (tested). A consumer that outruns its producer waits for
several rounds before it agrees (see :mod:`zephon.engine.rank`), so even a tight loop issues
about two agreements per 16 rounds. Over the default gloo group it never touches a GPU; NCCL
groups are refused (reading their result would synchronize the device): pass a gloo group over
the data-parallel ranks.
"""

from __future__ import annotations

from typing import Any

from zephon.distributed import gather_json, world_gloo_group
from zephon.errors import ConfigError
from zephon.logs import get_logger

log = get_logger(__name__)

OPEN = 1 << 62
"""``final`` of a rank whose data has not ended."""


class Pending:
    """The result of one agreement, read with :meth:`result` (waits if it has not arrived):
    ``(horizon, end)``, ``end`` None while no rank's data has ended at the horizon."""

    __slots__ = ("_tensor", "_values", "_work")

    def __init__(self, values: tuple[int, int] | None = None, work: Any = None,
                 tensor: Any = None):
        self._values, self._work, self._tensor = values, work, tensor

    def result(self) -> tuple[int, int | None]:
        if self._values is None:
            self._work.wait()
            made, final = (int(v) for v in self._tensor.tolist())
            self._values = (made, final)
            self._work = self._tensor = None
        made, final = self._values
        return made, (final if final == made else None)


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
    """``start(made, ended) -> Pending`` of the minimum over the data-parallel group."""

    def __init__(self, world_size: int, process_group: Any = None):
        self.world_size = world_size
        self._group = process_group
        self._warned = False

    @property
    def local(self) -> bool:
        """Whether this rank decides alone (one rank, or no process group to agree over):
        an agreement then costs nothing and answers at once."""
        if self.world_size == 1:
            return True
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return True
        return not dist.is_available() or not dist.is_initialized()

    def start(self, made: int, ended: bool) -> Pending:
        """Issue the agreement on this rank's ``made`` rounds (``ended``: its data ends
        there); it runs while the caller goes on."""
        values = (made, made if ended else OPEN)
        if self.world_size == 1:
            return Pending(values)
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return self._alone(values)
        if not dist.is_available() or not dist.is_initialized():
            return self._alone(values)
        if self._group is None:
            if dist.get_world_size() != self.world_size:
                return self._alone(values, "the default process group has "
                                   f"{dist.get_world_size()} ranks, not dp_world_size="
                                   f"{self.world_size}; pass process_group=<the DP group>")
            self._group = world_gloo_group()
        tensor = torch.tensor(values, dtype=torch.int64)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self._group, async_op=True)
        return Pending(work=work, tensor=tensor)

    def gather(self, value: Any) -> list[Any] | None:
        """``value`` (plain data) from every rank of the group, in rank order; None where
        the ranks cannot exchange (no process group)."""
        if self.world_size == 1:
            return [value]
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is present wherever ranks exist
            return None
        if not dist.is_available() or not dist.is_initialized():
            return None
        if self._group is None:
            if dist.get_world_size() != self.world_size:
                return None
            self._group = world_gloo_group()
        return gather_json(value, self._group)

    def _alone(self, values: tuple[int, int],
               why: str = "torch.distributed is not initialized") -> Pending:
        if not self._warned:
            log.warning("zephon: %s, so ranks cannot agree on the end of data; each rank stops "
                        "when its own lanes run out", why)
            self._warned = True
        return Pending(values)
