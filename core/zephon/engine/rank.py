"""The per-rank iterator: owned lanes, round-robin hand-out, prefetch, consumed state.

Rank ``r`` of ``W`` owns the lanes ``l`` with ``l % W == r`` and hands out, round by round, the
next microbatch of each of its lanes in lane order; global microbatch ``m`` is therefore the
``m // L``-th microbatch of lane ``m % L`` for every ``W`` that divides ``L``.

A producer thread runs the lanes ahead of the consumer, ``prefetch`` microbatches deep, and
attaches to every microbatch the snapshot its lane had right after making it. Handing the
microbatch to the caller makes that snapshot the lane's consumed state, so the state always
describes what the trainer received, never what was prefetched. ``prefetch=0`` runs the lanes
in the caller's thread. Either way the lanes produce the same microbatches.

A round is complete when every lane has its microbatch; the run ends on all ranks at the first
incomplete round (see :mod:`zephon.engine.agreement`), and the microbatches of that round are
reported as left over.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.lane import Lane, LanePlan

log = logging.getLogger(__name__)

_END = object()


class RankStream:
    def __init__(self, plan: LanePlan, rank: int, world_size: int, prefetch: int,
                 agree: Callable[[bool], bool]):
        self.plan = plan
        self.lanes = plan.lanes
        self.rank, self.world_size = rank, world_size
        self.owned = [lane for lane in range(self.lanes) if lane % world_size == rank]
        self.prefetch = prefetch
        self.agree = agree
        self.consumed: dict[int, dict[str, Any] | None] = dict.fromkeys(self.owned)
        self.start_global = 0
        self.handed = 0
        self.finished = False
        self.leftover = {"microbatches": 0, "rows": 0, "documents": 0, "tokens": 0}
        self._stop: threading.Event | None = None

    @property
    def consumed_global(self) -> int:
        """Global microbatches the run has consumed (all ranks), assuming lockstep ranks."""
        return self.start_global + self.handed * self.world_size

    def reset_to(self, consumed: dict[int, dict[str, Any] | None], start_global: int,
                 finished: bool, leftover: dict[str, int]) -> None:
        self.close()
        self.consumed = dict(consumed)
        self.start_global = start_global
        self.handed = 0
        self.finished = finished
        self.leftover = dict(leftover)

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[SampleBatch]:
        self.close()
        if self.finished:
            return iter(())
        lanes = {}
        for lane in self.owned:
            lanes[lane] = Lane(self.plan, lane)
            if self.consumed[lane] is not None:
                lanes[lane].restore(self.consumed[lane])
        start = self.consumed_global
        # Restart the hand-out count so consumed_global stays right across iterators.
        self.start_global, self.handed = start, 0
        stop = threading.Event()
        self._stop = stop
        return self._consume(lanes, start, stop)

    def _schedule(self, start: int) -> Iterator[tuple[int, list[int]]]:
        round_index = start // self.lanes
        while True:
            yield round_index, [lane for lane in self.owned
                                if round_index * self.lanes + lane >= start]
            round_index += 1

    def _produce(self, lanes: dict[int, Lane], start: int, emit: Callable[[Any], bool]) -> None:
        try:
            for _, pending in self._schedule(start):
                for lane in pending:
                    batch = lanes[lane].next_microbatch()
                    if not emit((lane, batch, lanes[lane].snapshot())):
                        return
                    if batch is None:
                        emit(_END)
                        return
        except BaseException as exc:  # forwarded to the consumer
            emit(("error", exc))

    def _consume(self, lanes: dict[int, Lane], start: int,
                 stop: threading.Event) -> Iterator[SampleBatch]:
        if self.prefetch > 0:
            channel: queue.Queue = queue.Queue(maxsize=self.prefetch)

            def emit(item: Any) -> bool:
                while not stop.is_set():
                    try:
                        channel.put(item, timeout=0.1)
                        return True
                    except queue.Full:
                        continue
                return False

            thread = threading.Thread(target=self._produce, args=(lanes, start, emit),
                                      name=f"zephon-rank{self.rank}", daemon=True)
            thread.start()
            receive = channel.get
        else:
            pending_items: list[Any] = []
            generator = self._produce_sync(lanes, start, pending_items)

            def receive() -> Any:
                return next(generator)

        try:
            for _, pending in self._schedule(start):
                items, ended = [], False
                for _ in pending:
                    item = receive()
                    if item is _END:
                        ended = True
                        break
                    if isinstance(item, tuple) and item[0] == "error":
                        raise item[1]
                    items.append(item)
                    if item[1] is None:
                        ended = True
                        break
                local_ok = not ended
                if not self.agree(local_ok):
                    self._finish(items)
                    return
                for lane, batch, snapshot in items:
                    if stop.is_set():
                        return
                    self.consumed[lane] = snapshot
                    self.handed += 1
                    yield batch
        finally:
            stop.set()

    def _produce_sync(self, lanes: dict[int, Lane], start: int,
                      _unused: list[Any]) -> Iterator[Any]:
        for _, pending in self._schedule(start):
            for lane in pending:
                batch = lanes[lane].next_microbatch()
                yield (lane, batch, lanes[lane].snapshot())
                if batch is None:
                    while True:
                        yield _END

    def _finish(self, items: list[tuple[int, SampleBatch | None, dict[str, Any]]]) -> None:
        for lane, batch, snapshot in items:
            if batch is None:
                self.consumed[lane] = snapshot  # keeps the counts of what the flush dropped
                continue
            self.leftover["microbatches"] += 1
            for record in batch.records:
                spans = record.meta.get("documents", ())
                self.leftover["rows"] += 1
                self.leftover["documents"] += sum(1 for s in spans if s.doc_start == 0)
                self.leftover["tokens"] += sum(s.length for s in spans)
        self.finished = True
        if self.leftover["microbatches"]:
            log.warning("zephon: end of data; rank %d left over %d microbatch(es) of an "
                        "incomplete round (%d rows, %d tokens) so that every rank gets the "
                        "same number of batches", self.rank, self.leftover["microbatches"],
                        self.leftover["rows"], self.leftover["tokens"])
