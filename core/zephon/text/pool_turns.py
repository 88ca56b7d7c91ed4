"""Batch calls take turns on the tokenizer's thread pool, handed straight from one to the next.

The Rust tokenizer runs every batch call on one thread pool per process (rayon). Two calls in
flight at once do not run side by side: a pool thread that waits for its share of one call
takes up the other call meanwhile, so the first call cannot return before the second is done.
Both return together, and the pool then idles while both callers turn their ids into arrays
with the GIL held, one after the other (measured: docs/measurements.md).

Taking turns, one call is in the pool at a time and the next starts the moment it returns:

1. A caller waits until no call is inside, then marks itself inside and makes its call.
2. When the call returns and another caller is waiting, the returning caller waits (at most
   :data:`HANDOFF_S`) until that caller has started, so the GIL goes to the caller that feeds
   the pool first, and only then turns its own ids into arrays, while the next call runs.

Only calls of at least :data:`MIN_TEXTS` texts take turns. The pool ends a call with one
thread finishing the last texts while the other has nothing left to take; with few, long
texts that tail is a large share of the call, and a second call in flight fills it better
than turns would. The encoder gives each call its texts longest first, so that the tail is
made of the shortest texts (:meth:`zephon.text.tokenizer.TextEncoder.encode`).

Turns and the longest-first order each close part of the gap to the bare tokenizer, and
together most of it; the fast engine (fastokens, :mod:`zephon.text.fast_engine`) does not take
turns: its own threads serve concurrent calls, each caller working on its own call's texts,
so no call waits for another's. ``python -m benchmarks.throughput`` prints the figures; the
README (Behaviour worth knowing) and docs/measurements.md keep the measured ones.

Limits: the turns are per process, as the pool is; a caller that does not go through them
(another library calling the same tokenizer) can still share the pool with a turn. After a
fork the child starts with no call inside (the parent's callers do not exist there).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANDOFF_S = 0.005
"""How long a returning caller waits for the next one to start, at most. The next caller
starts within microseconds when it gets the GIL; the bound only matters when it does not
(another thread holds the GIL for long), so the returning caller is never held up for more
than one GIL switch interval (5 ms by default)."""

MIN_TEXTS = 16
"""Calls of fewer texts do not take turns (see :func:`takes_turn`)."""


def takes_turn(texts: int) -> bool:
    """Whether a call of ``texts`` texts takes a turn."""
    return texts >= MIN_TEXTS


class PoolTurns:
    """One call at a time, handed from each returning caller to the next waiting one."""

    def __init__(self, handoff_s: float = HANDOFF_S):
        self.handoff_s = handoff_s
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = False
        self.waiting = 0
        """Callers waiting for their turn now (read it; only :meth:`run` changes it)."""
        self.started = 0
        """Calls started through :meth:`run` so far (read it; only :meth:`run` changes it)."""

    def run(self, call: Callable[..., T], *args, **kwargs) -> T:
        """``call(*args, **kwargs)`` when no other call is inside."""
        with self._cond:
            self.waiting += 1
            try:
                while self._inside:
                    self._cond.wait()
            finally:  # also when interrupted while waiting
                self.waiting -= 1
            self._inside = True
            self.started += 1
            self._cond.notify_all()  # a returning caller waits for this start
        try:
            return call(*args, **kwargs)
        finally:
            with self._cond:
                self._inside = False
                if self.waiting:
                    started = self.started
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self.started != started, self.handoff_s)


POOL_TURNS = PoolTurns()
"""The turns of this process's tokenizer pool."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL_TURNS._reset)
