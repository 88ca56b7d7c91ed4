"""The per-rank iterator: owned lanes, round-robin hand-out, read-ahead, consumed state.

Rank ``r`` of ``W`` owns the lanes ``l`` with ``l % W == r`` and hands out, round by round, the
next microbatch of each of its lanes in lane order; global microbatch ``m`` is therefore the
``m // L``-th microbatch of lane ``m % L`` for every ``W`` that divides ``L``.

Read-ahead. With ``prefetch > 0`` a producer thread runs the lanes ahead of the consumer, a
round at a time, up to :func:`rounds_ahead` rounds: as many as fit in ``read_ahead_tokens``,
at most :data:`MAX_ROUNDS_AHEAD`. A round goes to the consumer as soon as it is made (and
agreed, below), never held back for later rounds, so a producer only slightly faster than its
trainer still never makes it wait. Every microbatch carries the snapshot its lane had right
after making it; handing it to the caller makes that snapshot the lane's consumed state, so the
state always describes what the trainer received, never what was read ahead. Under the
producer, the dataset sources hand their document work to the document threads or worker
processes (:mod:`zephon.engine.document_threads`, :mod:`zephon.engine.workers`). ``prefetch=0``
runs the lanes and their document operators in the caller's thread, a round at a time. Either
way the lanes produce the same microbatches.

End of data. A round is complete when every lane has its microbatch; the rounds end on all
ranks at the first incomplete round, and the last round (:mod:`zephon.engine.last_round`)
hands out what the lanes still hold, in one order at every data-parallel size, leaving at most
``W - 1`` microbatches. Ranks hand out only rounds below the agreed *horizon*, the
rounds every rank has made (:mod:`zephon.engine.agreement`). The consumer agrees again when it
reaches the horizon, and, to keep that off the training thread's critical path, issues the
next agreement asynchronously halfway there: its result has long arrived when it is read. A
consumer that reaches the horizon with nothing in flight agrees at once if its producer has
the next round; if it outran its producer, it waits for 1, 2, 4, ... up to
:data:`MAX_GAIN` rounds (doubling while that repeats; beyond the round it needs, for at most
:data:`_GAIN_WAIT_S`) before it agrees, so a tight loop does not agree once per round.
Where each agreement is issued and read depends only on agreed results and the hand-out
count, so all ranks issue the same collectives in the same order, and a consumer that stops
never leaves a collective its peers did not also issue; only the counts they report depend on
timing. With one rank the agreement is local and free. Each rank then reports every microbatch no
rank handed out of the last round as left over, so the report accounts for all data read.
A run whose agreed end is its very first round and whose last round holds less than one
microbatch a rank, having consumed nothing before (not a resume at the end, not a state
loaded as finished), delivers no batch: every rank raises a DataError
saying why, from its lanes' counts (:mod:`zephon.engine.empty_run`), and so does a later
``iter()`` of the same stream.

One consumer at a time: a new ``iter()`` from the thread that iterates retires the previous
iterator (it ends) and continues from the consumed state; ``iter()`` from another thread while
an iterator is live raises, since two consumers would each get part of the stream.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from zephon import background
from zephon.engine.agreement import RoundAgreement
from zephon.engine.empty_run import empty_run_message
from zephon.engine.lane import Lane, LanePlan
from zephon.engine.last_round import LastRound, groups
from zephon.engine.loader_state import to_portable
from zephon.errors import DataError, ZephonError
from zephon.io import cancel
from zephon.logs import get_logger
from zephon.records import record_counts
from zephon.sample_batch import SampleBatch

log = get_logger(__name__)

_INTERRUPT_JOIN_S = 1.5
MAX_ROUNDS_AHEAD = 64
"""Rounds the producer may hold ahead of the consumer, at most (fewer where
``read_ahead_tokens`` says so). Each held round keeps its microbatches and one lane snapshot
per microbatch."""
_ROOM_POLL_S = 0.005
"""How often a producer holding all the rounds it may checks for room: the consumer takes
rounds without the lock, so nobody wakes the producer; a full producer is ``rounds_ahead``
rounds ahead, so a few milliseconds of delay cost nothing."""
MAX_GAIN = 16
"""Rounds a consumer that keeps outrunning its producer waits for before it agrees, at most."""
_GAIN_WAIT_S = 0.05
"""How long such a consumer waits for those rounds beyond the one it needs: a producer that
pauses (a slow download) then costs the trainer at most this, not the rounds after the pause."""


def rounds_ahead(read_ahead_tokens: int, round_tokens: int | None) -> int:
    """The rounds of ``round_tokens`` tokens that fit in ``read_ahead_tokens``, between 1 and
    :data:`MAX_ROUNDS_AHEAD` (rounds of unknown size: :data:`MAX_ROUNDS_AHEAD`)."""
    if not round_tokens:
        return MAX_ROUNDS_AHEAD
    return max(1, min(MAX_ROUNDS_AHEAD, read_ahead_tokens // round_tokens))


class _Drained:
    """What this rank's lanes made that no rank will hand out, counted (never held):
    leftover counts and each lane's final snapshot."""

    __slots__ = ("counts", "made", "snapshots")

    def __init__(self) -> None:
        self.counts = {"microbatches": 0, "rows": 0, "documents": 0, "tokens": 0}
        self.snapshots: dict[int, Any] = {}
        self.made = 0
        """Microbatches the last round made (all lanes, from where this iterator began)."""

    def count(self, batch: SampleBatch) -> None:
        self.counts["microbatches"] += 1
        for record in batch.records:
            documents, tokens = record_counts(record)
            self.counts["rows"] += 1
            self.counts["documents"] += documents
            self.counts["tokens"] += tokens


class _Partial:
    """The first incomplete round of this rank: its rounds end here."""

    __slots__ = ()


class _Failure:
    """An exception raised by the producer, re-raised on the consumer's thread."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _register(rounds: _Rounds, stop: threading.Event) -> Any:
    """An iterator abandoned mid-way has its producer stopped before the interpreter tears
    down (:mod:`zephon.background`)."""
    return None if rounds.thread is None else background.register_thread(stop, rounds.thread)


def _guarded(rounds: _Rounds, stop: threading.Event,
             hand_out: Iterator[SampleBatch]) -> Iterator[SampleBatch]:
    """``hand_out``'s microbatches, made by ``rounds``: a newer iterator (or a state load)
    that takes the stream over ends it quietly, and however it ends its producer is told to
    stop and waited for."""
    registration = _register(rounds, stop)
    interrupted = False
    try:
        yield from hand_out
    except _Superseded:
        return
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        _stopped(rounds, registration, interrupted)


def _stopped(rounds: _Rounds, registration: Any, interrupted: bool) -> None:
    """Wait for a producer told to stop (or halted), on the consumer's thread only. An
    iterator dropped without being closed is finalized by whichever thread collects it: the
    producer itself, or a document thread the producer may be waiting for, which must not
    wait for the producer in turn; any thread but the consumer's leaves the producer to stop
    on the event alone (:mod:`zephon.background` still waits for it at exit). The producer
    notices the stop within one received chunk of a download or after the microbatch it is
    making; joining it lets native resources it holds (open files, partial downloads,
    tokenizer threads) close before the interpreter exits. On Ctrl-C the wait is short: the
    user asked to stop."""
    if rounds.thread is None or threading.current_thread() is not rounds.consumer:
        return
    rounds.thread.join(timeout=_INTERRUPT_JOIN_S if interrupted else 30)
    if not rounds.thread.is_alive():
        background.unregister(registration)


class _Superseded(Exception):
    """Raised inside an iterator whose stream was taken over by a newer iterator."""


class _Rounds:
    """A production, in order: complete rounds (lists of ``(lane, microbatch, snapshot)``, or of
    the microbatches of a last-round group), then the end of the rounds (:class:`_Partial`)
    or of the last round (:class:`_Drained`).

    With ``threaded`` a producer thread makes them ahead, holding at most ``capacity`` complete
    rounds the consumer has not taken; otherwise they are made in the consumer's thread when
    it asks. ``made`` counts complete rounds, ``ended`` says the incomplete one was made.
    :meth:`halt` stops the producer after the microbatch it is making."""

    def __init__(self, production: Iterator[Any], capacity: int, stop: threading.Event,
                 threaded: bool, name: str):
        self._production = production
        self._capacity = capacity
        self._stop = stop
        self._cond = threading.Condition()
        self._ready: deque[Any] = deque()
        self._taken = 0
        self._failure: BaseException | None = None
        self._halted = False
        self.made = 0
        self.ended = False
        self.consumer = threading.current_thread()
        """The thread that takes the production (the one that made this object)."""
        self.thread: threading.Thread | None = None
        if threaded:
            self.thread = threading.Thread(target=self._produce, name=name, daemon=True)
            self.thread.start()

    def report(self) -> tuple[int, bool]:
        """``(made, ended)``, read together."""
        with self._cond:
            return self.made, self.ended

    def _put(self, item: Any) -> None:
        with self._cond:
            self._ready.append(item)
            if isinstance(item, list):
                self.made += 1
            elif isinstance(item, _Partial):
                self.ended = True
            elif isinstance(item, _Failure):
                self._failure = item.error
            self._cond.notify_all()

    def _produce(self) -> None:
        try:
            with cancel.cancel_when(self._stop):
                while True:
                    with self._cond:
                        while (self.made - self._taken >= self._capacity and not self.ended
                               and not self._stop.is_set() and not self._halted):
                            self._cond.wait(_ROOM_POLL_S)
                        if self._stop.is_set() or self._halted:
                            return
                    item = next(self._production, None)
                    if item is None:
                        return
                    self._put(item)
        except cancel.Cancelled:
            return
        except BaseException as exc:  # re-raised on the consumer's thread
            self._put(_Failure(exc))

    def halt(self) -> None:
        """Make no more: the consumer takes nothing further from this production."""
        with self._cond:
            self._halted = True
            self._cond.notify_all()

    def wait_for(self, target: int, timeout: float | None = None) -> None:
        """Until ``made >= target``, this rank's data has ended, or (with a thread)
        ``timeout`` seconds have passed."""
        if self.thread is None:
            while self.made < target and not self.ended:
                self._put(next(self._production))
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.made < target and not self.ended:
                if self._failure is not None:
                    raise self._failure
                if self._stop.is_set():
                    raise _Superseded
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    return
                self._cond.wait(left)

    def take(self) -> Any:
        """The next item of the production (made here, without a thread)."""
        if self._stop.is_set():
            raise _Superseded
        if self.thread is None and not self._ready:
            self._put(next(self._production))
        if self._ready:
            # Without the lock when an item is ready: a contended lock would release the GIL
            # on the training thread, which can then wait a switch interval to get it back.
            # Only this thread takes items, so the one seen stays there.
            item = self._ready.popleft()
        else:
            with self._cond:
                while not self._ready:
                    if self._stop.is_set():
                        raise _Superseded
                    self._cond.wait(0.1)
                item = self._ready.popleft()
        if isinstance(item, list):
            self._taken += 1  # read by the producer, which polls for room while it is full
        elif isinstance(item, _Failure):
            raise item.error
        return item


class RankStream:
    def __init__(self, plan: LanePlan, rank: int, world_size: int, prefetch: int,
                 agree: RoundAgreement, ahead: int = MAX_ROUNDS_AHEAD):
        self.plan = plan
        self.lanes = plan.lanes
        self.rank, self.world_size = rank, world_size
        self.owned = [lane for lane in range(self.lanes) if lane % world_size == rank]
        self.prefetch = prefetch
        self.agree = agree
        self.rounds_ahead = ahead
        """Complete rounds the producer may hold that the consumer has not taken."""
        self.agreements = {"ahead": 0, "on_demand": 0}
        """Agreements issued ahead of need (asynchronously) and when the consumer needed them."""
        self.consumed: dict[int, dict[str, Any] | None] = dict.fromkeys(self.owned)
        self.tail_from: int | None = None
        """The global microbatch at which the last round began, while this rank is in it
        (its lanes' consumed states are then those the round began from)."""
        self.start_global = 0
        self.handed = 0
        self.finished = False
        self.leftover = {"microbatches": 0, "rows": 0, "documents": 0, "tokens": 0}
        self.empty_run: str | None = None
        """Why this run delivered no batch, when its agreed end was its first round."""
        self._stop: threading.Event | None = None
        self._owner: threading.Thread | None = None

    @property
    def consumed_global(self) -> int:
        """Global microbatches the run has consumed (all ranks), assuming lockstep ranks."""
        return self.start_global + self.handed * self.world_size

    def reset_to(self, consumed: dict[int, dict[str, Any] | None], start_global: int,
                 finished: bool, leftover: dict[str, int], tail_from: int | None = None) -> None:
        self.close()
        self.consumed = dict(consumed)
        self.tail_from = tail_from
        self.start_global = start_global
        self.handed = 0
        self.finished = finished
        self.leftover = dict(leftover)
        self.empty_run = None

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
            if self.empty_run is not None:
                raise DataError(self.empty_run)
            return iter(())
        stop = threading.Event()
        if self.tail_from is not None:
            self.start_global, self.handed = self.consumed_global, 0
            self._stop = stop
            return self._last_round(stop, empty=False)
        lanes = {}
        for lane in self.owned:
            lanes[lane] = Lane(self.plan, lane)
            if self.consumed[lane] is not None:
                lanes[lane].restore(self.consumed[lane])
        start = self.consumed_global
        # Restart the hand-out count so consumed_global stays right across iterators.
        self.start_global, self.handed = start, 0
        self._stop = stop
        return self._consume(lanes, start, stop)

    def _schedule(self, start: int) -> Iterator[list[int]]:
        """This rank's lanes in each round from the one holding global microbatch
        ``start`` on (the first round may be partly consumed already)."""
        round_index = start // self.lanes
        while True:
            yield [lane for lane in self.owned if round_index * self.lanes + lane >= start]
            round_index += 1

    def _production(self, lanes: dict[int, Lane], start: int) -> Iterator[Any]:
        """See :class:`_Rounds`: complete rounds, then the first incomplete one's mark."""
        for pending in self._schedule(start):
            items = []
            for lane in pending:
                batch = lanes[lane].next_microbatch()
                if batch is None:
                    yield _Partial()
                    return
                items.append((lane, batch, lanes[lane].snapshot()))
            yield items

    def _consume(self, lanes: dict[int, Lane], start: int,
                 stop: threading.Event) -> Iterator[SampleBatch]:
        threaded = self.prefetch > 0
        rounds = _Rounds(self._production(lanes, start), self.rounds_ahead if threaded else 1,
                         stop, threaded, f"zephon-rank{self.rank}")
        yield from _guarded(rounds, stop, self._hand_rounds(rounds, start, stop))

    def _hand_rounds(self, rounds: _Rounds, start: int,
                     stop: threading.Event) -> Iterator[SampleBatch]:
        # Agreeing ahead, and waiting for several rounds after an outrun, pay off only where
        # a producer runs ahead and the agreement is a real collective.
        agree_ahead = rounds.thread is not None and not self.agree.local
        horizon, end = 0, None  # agreed: rounds below horizon exist on every rank
        handed = 0  # rounds this iterator handed out
        pending = None  # the agreement in flight
        issue_at: int | None = None  # where the next one goes out ahead of need
        outruns = 0  # agreements in a row for which this rank's producer was behind
        while True:
            if handed < horizon:
                if handed == issue_at:  # every earlier agreement has been read
                    self.agreements["ahead"] += 1
                    pending = self.agree.start(*rounds.report())
                for lane, batch, snapshot in rounds.take():
                    if stop.is_set():
                        return
                    self.consumed[lane] = snapshot
                    self.handed += 1
                    yield batch
                handed += 1
                continue
            if end is not None:  # every rank agreed on this same end
                rounds.halt()
                _stopped(rounds, None, interrupted=False)
                self.tail_from = self.consumed_global
                yield from self._last_round(stop, empty=start == 0 and end == 0)
                return
            if pending is None:
                gain = 1
                if agree_ahead:
                    made, ended = rounds.report()
                    outruns = outruns + 1 if made <= handed and not ended else 0
                    gain = min(MAX_GAIN, self.rounds_ahead, 1 << max(0, outruns - 1))
                rounds.wait_for(handed + 1)
                if gain > 1:
                    rounds.wait_for(handed + gain, timeout=_GAIN_WAIT_S)
                self.agreements["on_demand"] += 1
                pending = self.agree.start(*rounds.report())
            horizon, end = pending.result()
            pending = None
            issue_at = handed + (horizon - handed + 1) // 2 \
                if agree_ahead and end is None and horizon - handed >= 2 else None

    # -- the last round --------------------------------------------------------------------
    def _last_round(self, stop: threading.Event, empty: bool) -> Iterator[SampleBatch]:
        """Hand out this rank's positions of the last round, from where the consumed count
        is (see :mod:`zephon.engine.last_round`); ``empty``: the rounds delivered nothing, so
        a last round that delivers nothing either is an empty run."""
        assert self.tail_from is not None
        first = self.consumed_global - self.tail_from
        states = self._gathered_states()
        threaded = self.prefetch > 0
        rounds = _Rounds(self._last_round_production(states, first),
                         self.rounds_ahead if threaded else 1, stop, threaded,
                         f"zephon-rank{self.rank}")
        yield from _guarded(rounds, stop, self._hand_last_round(rounds, stop, empty))

    def _hand_last_round(self, rounds: _Rounds, stop: threading.Event,
                         empty: bool) -> Iterator[SampleBatch]:
        while True:
            item = rounds.take()
            if isinstance(item, _Drained):
                self._finish(item)
                if empty and self.handed == 0:
                    self.empty_run = empty_run_message(
                        self.plan.source.names(), self.consumed, item.made, self.rank,
                        self.world_size)
                    raise DataError(self.empty_run)
                return
            if stop.is_set():
                return
            self.handed += 1
            yield item[0]

    def _gathered_states(self) -> dict[int, Any] | None:
        """Every lane's consumed state (portable), this rank's and its peers' (None: the
        ranks cannot exchange them)."""
        mine = {str(lane): to_portable(self.consumed[lane]) for lane in self.owned}
        if len(self.owned) == self.lanes:
            parts: list[Any] | None = [mine]
        else:
            parts = self.agree.gather(mine)
            if parts is None:
                return None
        states: dict[int, Any] = {}
        for rank, part in enumerate(parts):
            if not isinstance(part, dict) or not all(
                    isinstance(k, str) and k.isdigit() and int(k) < self.lanes for k in part):
                raise DataError(f"rank {rank} sent lane states this pipeline has no lanes for "
                                f"at the last round of the data: {sorted(map(str, part))[:8]}")
            for key, value in part.items():
                states.setdefault(int(key), value)
        missing = [lane for lane in range(self.lanes) if lane not in states]
        if missing:
            raise DataError(f"no rank sent the states of lanes {missing} at the last round of "
                            f"the data; each lane must be owned by one data-parallel rank")
        return states

    def _last_round_production(self, states: dict[int, Any] | None,
                               first: int) -> Iterator[Any]:
        """This rank's microbatch of each complete group of the last round (one-element
        lists), then what it leaves over (:class:`_Drained`, with its lanes' final states).
        Without ``states`` its own lanes are run to their end and all counted left over."""
        rest = _Drained()
        if states is None:
            lanes = LastRound(self.plan, {lane: to_portable(self.consumed[lane])
                                          for lane in self.owned})
            for batch in lanes.microbatches():
                rest.count(batch)
                rest.made += 1
        else:
            lanes = LastRound(self.plan, states)
            mine = (self.rank - first) % self.world_size
            for group in groups(lanes.microbatches(), first, self.world_size,
                                self.tail_from or 0):
                if isinstance(group, list):
                    rest.made += len(group)
                    yield [group[mine]]
                else:
                    rest.made += len(group[0])
                    if mine < len(group[0]):
                        rest.count(group[0][mine])
        rest.snapshots = {lane: lanes.snapshot(lane) for lane in self.owned}
        yield rest

    def _finish(self, rest: _Drained) -> None:
        """End of data: count what no rank will hand out of this rank's positions."""
        self.consumed.update(rest.snapshots)
        for key, value in rest.counts.items():
            self.leftover[key] += value
        self.finished = True
        self.tail_from = None
        if self.leftover["microbatches"]:
            log.warning("zephon: end of data; rank %d left over %d microbatch(es) "
                        "(%d rows, %d tokens) so that every rank gets the same number of "
                        "batches", self.rank, self.leftover["microbatches"],
                        self.leftover["rows"], self.leftover["tokens"])
