"""The per-rank iterator: owned lanes, round-robin hand-out, read-ahead, consumed state.

Rank ``r`` of ``W`` owns the lanes ``l`` with ``l % W == r`` and hands out, round by round, the
next microbatch of each of its lanes in lane order; global microbatch ``m`` is therefore the
``m // L``-th microbatch of lane ``m % L`` for every ``W`` that divides ``L``.

Read-ahead. With ``prefetch > 0`` a producer thread runs the lanes ahead of the consumer in
windows of 1, 2, 4, ... rounds up to :func:`window_rounds` (at most 16): the largest window for
which :data:`WINDOWS_HELD` windows fit in ``read_ahead_tokens``. At most that many windows
exist at once (the one being handed out and the ones made ahead); the producer waits for room
before it makes the next, so read-ahead memory is bounded by the token budget, not by a
microbatch count. Every microbatch carries the snapshot its lane had right after making it;
handing it to the caller makes that snapshot the lane's consumed state, so the state always
describes what the trainer received, never what was read ahead. Under the producer, the
dataset sources hand their document work to the document thread or worker processes
(:mod:`zephon.engine.document_thread`, :mod:`zephon.engine.workers`). ``prefetch=0`` runs the
lanes and their document operators in the caller's thread, a round at a time. Either way the
lanes produce the same microbatches.

End of data. A round is complete when every lane has its microbatch; the run ends on all ranks
at the first incomplete round. Ranks agree per window, not per microbatch
(:mod:`zephon.engine.agreement`): the consumer issues the agreement for the next window when it
starts handing out the current one, asynchronously, and reads the result when it needs it, so
the collective's latency hides behind a window of training. Where the next window was not yet
made on every rank, the result says so and the consumer agrees again, synchronously, when it
needs that window; it then goes on synchronously (once per window) until an agreement finds
every rank a window ahead. Every choice between the two depends only on agreed results, so all
ranks issue the same collectives in the same order, and a consumer that stops never leaves a
collective its peers did not also issue. Each rank then runs its lanes to their end and
reports every microbatch no rank handed out as left over, so the report accounts for all data
read.

One consumer at a time: a new ``iter()`` from the thread that iterates retires the previous
iterator (it ends) and continues from the consumed state; ``iter()`` from another thread while
an iterator is live raises, since two consumers would each get part of the stream.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.agreement import SPAN, UNKNOWN, RoundAgreement
from zephon.engine.lane import Lane, LanePlan
from zephon.errors import ZephonError
from zephon.io import cancel
from zephon.records import record_counts

log = logging.getLogger(__name__)

_END = object()
_INTERRUPT_JOIN_S = 1.5
WINDOW_ROUNDS = 16
"""Rounds per window once the windows have grown (1, 2, 4, 8, 16, 16, ...), at most."""
WINDOWS_HELD = 3
"""Windows that may exist at once: the one being handed out and two made ahead."""


def window_rounds(read_ahead_tokens: int, round_tokens: int | None) -> int:
    """The largest window (in rounds) for which :data:`WINDOWS_HELD` windows of
    ``round_tokens`` tokens a round fit in ``read_ahead_tokens``, between 1 and
    :data:`WINDOW_ROUNDS` (rounds of unknown size: :data:`WINDOW_ROUNDS`). Computed from the
    recipe alone, so every rank uses the same windows."""
    if not round_tokens:
        return WINDOW_ROUNDS
    return max(1, min(WINDOW_ROUNDS, read_ahead_tokens // (WINDOWS_HELD * round_tokens)))


def _window_size(index: int, largest: int) -> int:
    return min(1 << min(index, 30), largest)


class _Window:
    """Rounds of microbatches of one window: its size in the schedule, how many of its
    rounds this rank has complete, and whether this rank's data ends in it."""

    __slots__ = ("complete", "ended", "rounds", "size")

    def __init__(self, rounds: list[list[Any]], size: int, complete: int, ended: bool):
        self.rounds, self.size, self.complete, self.ended = rounds, size, complete, ended


class _Drained:
    """What this rank's lanes made after its last window, counted (never held): leftover
    counts and each lane's final snapshot."""

    __slots__ = ("counts", "snapshots")

    def __init__(self) -> None:
        self.counts = {"microbatches": 0, "rows": 0, "documents": 0, "tokens": 0}
        self.snapshots: dict[int, Any] = {}

    def add(self, items: Iterable[Any]) -> _Drained:
        for lane, batch, snapshot in items:
            self.snapshots[lane] = snapshot  # final counts, including what a flush dropped
            if batch is None:
                continue
            self.counts["microbatches"] += 1
            for record in batch.records:
                documents, tokens = record_counts(record)
                self.counts["rows"] += 1
                self.counts["documents"] += documents
                self.counts["tokens"] += tokens
        return self


class _Failure:
    """An exception raised by the producer, re-raised on the consumer's thread."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class _Handoff:
    """Windows from the producer thread to the consumer. At most ``capacity`` windows exist
    that the consumer has not finished: the producer waits for room before making the next
    one, so what is read ahead never exceeds ``capacity`` windows."""

    def __init__(self, capacity: int, stop: threading.Event):
        self._capacity = capacity
        self._stop = stop
        self._cond = threading.Condition()
        self._ready: deque[Any] = deque()
        self._open = 0

    def wait_for_room(self) -> bool:
        with self._cond:
            while self._open >= self._capacity and not self._stop.is_set():
                self._cond.wait(0.1)
            return not self._stop.is_set()

    def put(self, item: Any) -> None:
        with self._cond:
            self._ready.append(item)
            if isinstance(item, _Window):
                self._open += 1
            self._cond.notify_all()

    def get(self, block: bool) -> Any:
        """The next item, or None when ``block`` is false and none is ready."""
        with self._cond:
            while not self._ready:
                if self._stop.is_set():
                    raise _Superseded
                if not block:
                    return None
                self._cond.wait(0.1)
            return self._ready.popleft()

    def finished(self) -> None:
        """The consumer is done with one window: room for the producer."""
        with self._cond:
            self._open -= 1
            self._cond.notify_all()


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
                 agree: RoundAgreement, largest_window: int = WINDOW_ROUNDS):
        self.plan = plan
        self.lanes = plan.lanes
        self.rank, self.world_size = rank, world_size
        self.owned = [lane for lane in range(self.lanes) if lane % world_size == rank]
        self.prefetch = prefetch
        self.agree = agree
        self.largest_window = largest_window
        self.agreements = {"ahead": 0, "on_demand": 0}
        """Agreements issued ahead of need (asynchronously) and when the consumer needed them."""
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
                 largest: int) -> Iterator[_Window | _Drained]:
        """Rounds in windows of 1, 2, 4, ... ``largest`` rounds (a fixed schedule, the same
        on every rank), each with the number of its rounds this rank has complete. After the
        window where this rank's data ends comes the rest of its production, counted."""
        schedule = self._schedule(start)
        ended: set[int] = set()
        for index in itertools.count():
            size = _window_size(index, largest)
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
                yield _Window(rounds, size, complete, False)
                continue
            yield _Window(rounds, size, complete, True)
            yield _Drained().add(item for item in production if item is not _END)
            return

    def _consume(self, lanes: dict[int, Lane], start: int,
                 stop: threading.Event) -> Iterator[SampleBatch]:
        # Windows grow to largest_window rounds when a producer thread runs ahead; without one
        # (prefetch=0) every round is a window, agreed on as it is needed.
        largest = self.largest_window if self.prefetch > 0 else 1
        windows = self._windows(self._production(lanes, start), start, largest)
        thread = None
        if self.prefetch > 0:
            handoff = _Handoff(WINDOWS_HELD, stop)

            def produce() -> None:
                try:
                    with cancel.cancel_when(stop):
                        while handoff.wait_for_room():
                            window = next(windows, None)
                            if window is None:
                                return
                            handoff.put(window)
                except cancel.Cancelled:
                    return
                except BaseException as exc:  # re-raised on the consumer's thread
                    handoff.put(_Failure(exc))

            thread = threading.Thread(target=produce, name=f"zephon-rank{self.rank}",
                                      daemon=True)
            thread.start()
            _RUNNING.add((stop, thread))

            def receive(block: bool) -> Any:
                item = handoff.get(block)
                if isinstance(item, _Failure):
                    raise item.error
                return item

            finished = handoff.finished
        else:
            def receive(block: bool) -> Any:
                if stop.is_set():
                    raise _Superseded
                return next(windows) if block else None

            def finished() -> None:
                pass

        local: deque[_Window] = deque()  # received, not finished; local[0] is window `base`
        drained: list[_Drained] = []
        base = 0

        def take(block: bool) -> bool:
            """Receive one more window (False: none ready, or only the drained rest)."""
            item = receive(block)
            if isinstance(item, _Drained):
                drained.append(item)
                return False
            if item is not None:
                local.append(item)
            return item is not None

        agreed: dict[int, int] = {}  # window index -> rounds every rank hands out
        unagreed = 0  # the first window without an agreed count
        ahead = False  # the last agreement found every rank a window ahead: agree early

        def entries(first: int) -> list[int]:
            """This rank's complete rounds for windows first .. first + SPAN - 1."""
            while not drained and take(False):
                pass
            out = []
            for index in range(first, first + SPAN):
                if index - base < len(local):
                    out.append(local[index - base].complete)
                elif local and local[-1].ended:
                    out.append(0)  # this rank's data ended in an earlier window
                else:
                    out.append(UNKNOWN)
            return out

        def settle(result: list[int], first: int, early: bool) -> None:
            nonlocal unagreed, ahead
            covered = 0
            for value in result:
                if value == UNKNOWN:
                    break
                agreed[first + covered] = value
                covered += 1
                if value < _window_size(first + covered - 1, largest):
                    break  # the data ends in this window: later entries mean nothing
            unagreed = first + covered
            ahead = covered >= (1 if early else 2)

        pending = None
        interrupted = False
        try:
            while True:
                index = base
                if index not in agreed and pending is not None:
                    first, handle = pending
                    pending = None
                    settle(handle.result(), first, True)
                if index not in agreed:  # agree now, once this rank has the window
                    while not local:
                        take(True)
                    self.agreements["on_demand"] += 1
                    settle(self.agree.start(unagreed, entries(unagreed)).result(), unagreed,
                           False)
                window, count = local[0], agreed.pop(index)
                if count == window.size and ahead and pending is None \
                        and index + 1 == unagreed:
                    # Agree on the next window while this one is handed out.
                    self.agreements["ahead"] += 1
                    pending = (unagreed, self.agree.start(unagreed, entries(unagreed)))
                for items in window.rounds[:count]:
                    for lane, batch, snapshot in items:
                        if stop.is_set():
                            return
                        self.consumed[lane] = snapshot
                        self.handed += 1
                        yield batch
                local.popleft()
                finished()
                base += 1
                if count < window.size:  # some rank's data ended in this window: drain
                    rest = _Drained().add(item for items in window.rounds[count:]
                                          for item in items)
                    while not window.ended:
                        while not local:
                            take(True)
                        window = local.popleft()
                        finished()
                        rest.add(item for items in window.rounds for item in items)
                    while not drained:
                        take(True)
                    self._finish(rest, drained[0])
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

    def _finish(self, *parts: _Drained) -> None:
        """End of data: count what no rank will hand out (this rank's drained lanes)."""
        for part in parts:
            self.consumed.update(part.snapshots)
            for key, value in part.counts.items():
                self.leftover[key] += value
        self.finished = True
        if self.leftover["microbatches"]:
            log.warning("zephon: end of data; rank %d left over %d microbatch(es) "
                        "(%d rows, %d tokens) so that every rank gets the same number of "
                        "batches", self.rank, self.leftover["microbatches"],
                        self.leftover["rows"], self.leftover["tokens"])
