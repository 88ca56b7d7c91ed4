"""Cancelling slow IO from outside the thread that does it.

A loader's producer thread runs ``with cancel_when(stop):``; when the consumer goes away
(Ctrl-C, a closed or superseded iterator) it sets ``stop``, and downloads, retry waits and
cache-space waits in that thread raise :class:`Cancelled` at their next check (every received
chunk, every 0.1 s of waiting), so their ``finally`` blocks remove partial files at once.
Threads without an event (the caller's own thread) are never cancelled this way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from zephon.errors import ZephonError

_local = threading.local()


class Cancelled(ZephonError):
    """The consumer stopped while this thread was reading or waiting."""


@contextlib.contextmanager
def cancel_when(event: threading.Event) -> Iterator[None]:
    """Let IO in this thread be cancelled by ``event``."""
    previous = getattr(_local, "event", None)
    _local.event = event
    try:
        yield
    finally:
        _local.event = previous


def check() -> None:
    """Raise :class:`Cancelled` when this thread's event is set."""
    event = getattr(_local, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("the loader stopped while this thread was reading")


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early (raising :class:`Cancelled`) when cancelled."""
    event = getattr(_local, "event", None)
    if event is None:
        time.sleep(seconds)
        return
    if event.wait(seconds):
        check()
