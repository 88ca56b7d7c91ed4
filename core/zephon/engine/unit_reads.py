"""Reading a lane's next work unit while the lane works on the one before.

Decoding a Parquet row group (or an Arrow record batch) is native code that runs with the GIL
released: 0.12 s of the 0.5 s a lane spends on 12M tokens of Parquet text with the fast
tokenizer engine. Done in the lane's own thread, that time adds to the lane's; done here, on
one reader thread per pipeline, it overlaps the lane's Python work and the tokenizer's calls,
which left a core idle: the whole pipeline took 8-18% less time, with the background thread
and without it (measured: docs/measurements.md).

A :class:`~zephon.engine.dataset_source.DatasetSource` asks for its next unit
(:meth:`UnitReads.ask`) as soon as it begins a unit (asked one read-ahead batch before it was
needed, the unit was often not read in time), and takes the rows (:meth:`PendingUnit.rows`)
when it loads the unit. The rows are the same as those the source would read itself, in the
same order, so nothing the lane makes depends on this or on its timing; an error reading the
unit is raised when the source takes it, as if it had read the unit then, and never if it
does not.

Limits: at most :data:`UNITS_AHEAD` units are read ahead for a pipeline, held until taken or
dropped, which bounds the memory this costs to that many units' columns (one Parquet row
group's text as Python strings, each); a source that asks while they are all held reads its
unit itself, as before: with 8 lanes, only the sources that began their units first are
helped, and the pipeline took 0.87-1.08x the time (measured: docs/measurements.md). Only
units whose reading releases the GIL are read ahead (JSON Lines are parsed in Python: a
thread would only take turns with the lane). The reader thread is a daemon thread, started at
the first ask and stopped when the pipeline is dropped or at interpreter exit
(:mod:`zephon.background`), after the unit it is reading.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import zephon.background as background

UNITS_AHEAD = 2
"""Units read ahead and not yet taken, at most, per pipeline."""


class PendingUnit:
    """One unit's rows being read ahead, for the source that asked. Whichever comes first
    reads them: the reader thread, or the source taking them (which then does not wait for
    the reads queued before it, nor for a reader thread stopped at exit)."""

    __slots__ = ("_claimed", "_done", "_error", "_owner", "_read", "_released", "_rows")

    def __init__(self, owner: UnitReads, read: Callable[[], Any]):
        self._owner = owner
        self._read: Callable[[], Any] | None = read
        self._claimed = False
        self._done = threading.Event()
        self._rows: Any = None
        self._error: BaseException | None = None
        self._released = False

    def run(self) -> None:
        """Read the rows here, unless someone already does or did."""
        with self._owner.lock:
            if self._claimed:
                return
            self._claimed = True
        read, self._read = self._read, None
        try:
            self._rows = read()  # type: ignore[misc]
        except BaseException as exc:  # raised to the source when it takes the rows
            self._error = exc
        finally:
            self._done.set()

    def rows(self) -> Any:
        """The unit's rows (read here if the reader thread has not begun them); raises what
        reading raised."""
        self.run()
        self._done.wait()
        self.drop()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        rows, self._rows = self._rows, None
        return rows

    def drop(self) -> None:
        """Give the rows up (taken, or the source restarted elsewhere): the slot is free
        again. Rows being read are dropped once read."""
        with self._owner.lock:
            if not self._claimed:  # not begun: the reader thread skips it
                self._claimed, self._read = True, None
                self._done.set()
        if not self._released:
            self._released = True
            self._owner.release()


class UnitReads:
    """A pipeline's reader thread and its slots; see the module docstring."""

    def __init__(self, units_ahead: int = UNITS_AHEAD):
        self.units_ahead = units_ahead
        self.lock = threading.Lock()
        self._held = 0
        self._queue: queue.SimpleQueue[PendingUnit | None] | None = None
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._finalizer: weakref.finalize | None = None

    def ask(self, read: Callable[[], Any]) -> PendingUnit | None:
        """Have ``read()`` run on the reader thread; None when every slot is held (the source
        then reads the unit itself)."""
        with self.lock:
            if self._held >= self.units_ahead:
                return None
            self._held += 1
            if self._queue is None or self._pid != os.getpid():  # not started, or forked
                self._start()
            requests = self._queue
        pending = PendingUnit(self, read)
        requests.put(pending)  # type: ignore[union-attr]
        return pending

    @property
    def held(self) -> int:
        """Slots held: units read ahead (or being read) and not yet taken or dropped."""
        return self._held

    @property
    def thread(self) -> threading.Thread | None:
        """The reader thread, once started."""
        return self._thread

    def release(self) -> None:
        with self.lock:
            self._held -= 1

    def _start(self) -> None:
        requests: queue.SimpleQueue[PendingUnit | None] = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(requests,), name="zephon-unit-reader",
                                  daemon=True)
        thread.start()
        background.register(lambda: requests.put(None), lambda: (thread,))
        self._queue, self._thread, self._pid = requests, thread, os.getpid()
        self._finalizer = weakref.finalize(self, requests.put, None)

    def close(self) -> None:
        """Stop the reader thread after the unit it is reading; the units asked for and not
        begun are read by the sources that take them."""
        if self._finalizer is not None:
            self._finalizer()
        self._queue = self._finalizer = None


def _serve(requests: queue.SimpleQueue[PendingUnit | None]) -> None:
    while True:
        pending = requests.get()
        if pending is None:
            return
        pending.run()
        del pending  # waits holding nothing: the pipeline, once dropped, stops this thread
