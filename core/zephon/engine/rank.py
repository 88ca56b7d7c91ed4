"""The per-rank iterator: owned lanes, round-robin hand-out, prefetch, consumed state.

Rank ``r`` of ``W`` owns the lanes ``l`` with ``l % W == r`` and hands out, round by round, the
next microbatch of each of its lanes in lane order; global microbatch ``m`` is therefore the
``m // L``-th microbatch of lane ``m % L`` for every ``W`` that divides ``L``.

With ``prefetch > 0`` a producer thread runs the lanes ahead of the consumer in agreement
windows of 1, 2, 4, 8, then 16 rounds, one window waiting while the consumer hands out the
previous one (so up to 32 rounds ahead), and attaches to every microbatch the snapshot its lane
had right after making it. Handing the microbatch to the caller makes that snapshot the lane's
consumed state, so the state always describes what the trainer received, never what was
prefetched. ``prefetch=0`` runs the lanes in the caller's thread, a round at a time. Either way
the lanes produce the same microbatches.

One consumer at a time: a new ``iter()`` from the thread that iterates retires the previous
iterator (it ends) and continues from the consumed state; ``iter()`` from another thread while
an iterator is live raises, since two consumers would each get part of the stream.

A round is complete when every lane has its microbatch; the run ends on all ranks at the first
incomplete round. Ranks agree once per window of rounds, not per microbatch (see
:mod:`zephon.engine.agreement`); the agreement runs on the consumer's thread so that a consumer
that stops never leaves a collective half issued. Each rank then runs its lanes to their end
and reports every microbatch no rank handed out as left over, so the report accounts for all
data read.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.lane import Lane, LanePlan
from zephon.errors import ZephonError
from zephon.io import cancel
from zephon.records import record_counts

log = logging.getLogger(__name__)

_END = object()
_INTERRUPT_JOIN_S = 1.5
WINDOW_ROUNDS = 16
"""Rounds per end-of-data agreement once the windows have grown (1, 2, 4, 8, 16, 16, ...)."""


class _Window:
    """Rounds of microbatches of one agreement window: the window's size in the schedule,
    how many of its rounds this rank has complete, and, in the last window this rank
    produces (its data ended), the rest of its production."""

    __slots__ = ("complete", "rest", "rounds", "size")

    def __init__(self, rounds: list[list[Any]], size: int, complete: int,
                 rest: list[Any] | None):
        self.rounds, self.size, self.complete, self.rest = rounds, size, complete, rest


class _Superseded(Exception):
    """Raised inside an iterator whose stream was taken over by a newer iterator."""

_RUNNING: set[tuple[threading.Event, threading.Thread]] = set()


@atexit.register
def _stop_producers() -> None:
    """Stop producers of iterators abandoned mid-way before the interpreter tears down."""
    for stop, thread in list(_RUNNING):
        stop.set()
        thread.join(timeout=2)


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
        self._owner: threading.Thread | None = None

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
        owner, me = self._owner, threading.current_thread()
        if (self._stop is not None and not self._stop.is_set() and owner is not None
                and owner is not me and owner.is_alive()):
            raise ZephonError(
                f"this pipeline is being iterated by thread {owner.name!r}; a pipeline hands "
                f"its batches to one consumer at a time, so {me.name!r} would silently split "
                "the stream with it. Finish or close() the other iterator first, or build one "
                "pipeline per consumer.")
        self._owner = me
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

    def _production(self, lanes: dict[int, Lane], start: int) -> Iterator[Any]:
        """(lane, microbatch or None, snapshot) in hand-out order; a lane that has ended is
        skipped afterwards, and _END follows once every owned lane has ended."""
        ended: set[int] = set()
        for _, pending in self._schedule(start):
            for lane in pending:
                if lane in ended:
                    continue
                batch = lanes[lane].next_microbatch()
                if batch is None:
                    ended.add(lane)
                yield lane, batch, lanes[lane].snapshot()
            if len(ended) == len(self.owned):
                yield _END
                return

    def _windows(self, production: Iterator[Any], start: int,
                 largest: int) -> Iterator[_Window]:
        """Rounds in agreement windows of 1, 2, 4, ... ``largest`` rounds (a fixed schedule,
        the same on every rank), each with the number of its rounds this rank has complete.
        The window where this rank's data ends also carries the rest of its production, for
        the leftover count, and is the last."""
        schedule = self._schedule(start)
        ended: set[int] = set()
        size = 1
        while True:
            rounds: list[list[Any]] = []
            complete = 0
            for _ in range(size):
                _, pending = next(schedule)
                items = []
                for lane in pending:
                    if lane in ended:
                        continue
                    item = next(production)
                    items.append(item)
                    if item[1] is None:
                        ended.add(lane)
                rounds.append(items)
                if len(items) < len(pending) or any(item[1] is None for item in items):
                    break
                complete += 1
            if complete == size:
                yield _Window(rounds, size, complete, None)
                size = min(2 * size, largest)
                continue
            rest = [item for item in production if item is not _END]
            yield _Window(rounds, size, complete, rest)
            return

    def _consume(self, lanes: dict[int, Lane], start: int,
                 stop: threading.Event) -> Iterator[SampleBatch]:
        # Agreement windows grow to WINDOW_ROUNDS rounds when a producer thread runs ahead;
        # without one (prefetch=0) every round is agreed on as it is needed.
        largest = WINDOW_ROUNDS if self.prefetch > 0 else 1
        windows = self._windows(self._production(lanes, start), start, largest)
        if self.prefetch > 0:
            # One window waits while the consumer hands out the previous one.
            channel: queue.Queue = queue.Queue(maxsize=1)

            def offer(item: Any) -> bool:
                while not stop.is_set():
                    try:
                        channel.put(item, timeout=0.1)
                        return True
                    except queue.Full:
                        continue
                return False

            def produce() -> None:
                try:
                    with cancel.cancel_when(stop):
                        for window in windows:
                            if not offer(window):
                                return
                except cancel.Cancelled:
                    return
                except BaseException as exc:  # forwarded to the consumer
                    offer(("error", exc))

            thread = threading.Thread(target=produce, name=f"zephon-rank{self.rank}",
                                      daemon=True)
            thread.start()
            _RUNNING.add((stop, thread))

            def receive() -> Any:
                while not stop.is_set():
                    try:
                        return channel.get(timeout=0.1)
                    except queue.Empty:
                        continue
                raise _Superseded
        else:
            thread = None

            def receive() -> Any:
                if stop.is_set():
                    raise _Superseded
                return next(windows)

        def take() -> _Window:
            window = receive()
            if isinstance(window, tuple) and window[0] == "error":
                raise window[1]
            return window

        interrupted = False
        try:
            while True:
                window = take()
                # Agreed on the consumer's thread, once per window: a consumer that stops
                # never leaves a collective half issued.
                agreed = self.agree(window.complete)
                for items in window.rounds[:agreed]:
                    for lane, batch, snapshot in items:
                        if stop.is_set():
                            return
                        self.consumed[lane] = snapshot
                        self.handed += 1
                        yield batch
                if agreed < window.size:  # some rank's data ended in this window
                    left = [item for items in window.rounds[agreed:] for item in items]
                    while window.rest is None:  # this rank's production goes on: drain it
                        window = take()
                        left += [item for items in window.rounds for item in items]
                    self._finish(left + window.rest)
                    return
        except _Superseded:
            return  # a newer iterator (or a state load) owns this stream now
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            stop.set()
            if thread is not None:
                # The producer notices the stop within one received chunk of a download or
                # after the microbatch it is making; joining it lets native resources it
                # holds (open files, partial downloads, tokenizer threads) close before the
                # interpreter exits. On Ctrl-C the wait is short: the user asked to stop.
                thread.join(timeout=_INTERRUPT_JOIN_S if interrupted else 30)
                _RUNNING.discard((stop, thread))

    def _finish(self, items: list[Any]) -> None:
        """End of data: count what no rank will hand out (this rank's drained lanes)."""
        for lane, batch, snapshot in items:
            self.consumed[lane] = snapshot  # final counts, including what a flush dropped
            if batch is None:
                continue
            self.leftover["microbatches"] += 1
            for record in batch.records:
                documents, tokens = record_counts(record)
                self.leftover["rows"] += 1
                self.leftover["documents"] += documents
                self.leftover["tokens"] += tokens
        self.finished = True
        if self.leftover["microbatches"]:
            log.warning("zephon: end of data; rank %d left over %d microbatch(es) "
                        "(%d rows, %d tokens) so that every rank gets the same number of "
                        "batches", self.rank, self.leftover["microbatches"],
                        self.leftover["rows"], self.leftover["tokens"])
