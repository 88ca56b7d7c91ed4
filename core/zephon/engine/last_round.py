"""The last round: what the lanes still hold when the data ends, handed out in one order at
every data-parallel size.

Rounds end at the first round ``E`` in which some lane has no microbatch, agreed by every
rank (:mod:`zephon.engine.agreement`). The other lanes still hold data then: lanes are dealt
units of equal bytes, but bytes do not tell tokens at that grain (over 6 JSON Lines files and
8 lanes the lanes' tokens differ by up to 5.9% and stopping at the shortest left 2.4% of the
epoch unread; a small set with one or two units a lane can leave a quarter of it).

Algorithm. The last round starts from the lanes' states after round ``E - 1``, which every
rank receives from the ranks that own them (one gather of plain data,
:func:`zephon.distributed.gather_json`; each state is checked as a loaded state is). Every rank
restores all ``L`` lanes and runs them in turns: in turn ``k`` each lane whose next microbatch
is its ``k``-th makes it, in lane order; a lane that has ended is skipped from then on. The
``t``-th microbatch so made is *last-round position* ``t`` and global microbatch ``E L + t``.
The sequence depends on the lanes' states alone, so it is the same at every data-parallel
size ``W``. Rank ``r`` hands out the positions ``t`` with ``t % W == r``, a group of ``W``
positions at a time, and a group only when all ``W`` of its positions exist: every rank then
hands the same number of microbatches (none waits in a collective for a peer that stopped) and
at most ``W - 1`` microbatches are left over, where the rounds alone left the lanes' whole
difference.

Limits and costs: each rank makes the whole last round, its peers' lanes included, so the job
spends ``W`` times that round's work (1-3% of an epoch where lanes hold several units) once
per pass over the data, and reads its peers' units. Ranks that cannot exchange states (no
process group to gather over) hand out nothing of the last round and count it as left over.
While a rank is in the last round its loader state holds its lanes' states at the round's
start and the global microbatch the round began at (``tail_from``), so a resume at any size
gathers them again and goes on at the next position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from zephon.engine.lane import Lane, LanePlan, restored_lane
from zephon.sample_batch import SampleBatch


class LastRound:
    """The lanes of ``plan`` named in ``states`` (all of them for a last round), restored from
    their portable snapshots (None: a lane that has made nothing) and made in the order the
    module docstring states. A state that its lane could not have written raises
    :class:`~zephon.field_checks.StateFieldError`."""

    def __init__(self, plan: LanePlan, states: dict[int, Any]):
        self.lanes: dict[int, Lane] = {}
        for lane in sorted(states):
            saved = states[lane]
            self.lanes[lane] = (Lane(plan, lane) if saved is None
                                else restored_lane(plan, lane, saved)[1])

    def microbatches(self) -> Iterator[SampleBatch]:
        """The microbatches, position by position, to the end of every lane."""
        live = list(self.lanes)
        while live:
            turn = min(self.lanes[lane].microbatches for lane in live)
            for lane in [lane for lane in live if self.lanes[lane].microbatches == turn]:
                batch = self.lanes[lane].next_microbatch()
                if batch is None:
                    live.remove(lane)
                else:
                    yield batch

    def snapshot(self, lane: int) -> dict[str, Any]:
        return self.lanes[lane].snapshot()


def groups(batches: Iterator[SampleBatch], first: int, size: int, start: int
           ) -> Iterator[list[SampleBatch] | tuple[list[SampleBatch]]]:
    """From position ``first`` on, ``batches`` in complete groups of ``size`` (lists), their
    global microbatch set (``start`` is the global microbatch of position 0); then the
    incomplete rest, as a one-element tuple holding its list."""
    group: list[SampleBatch] = []
    for position, batch in enumerate(batches):
        if position < first:
            continue
        batch.position = start + position
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    yield (group,)
