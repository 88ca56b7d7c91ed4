"""The loader's background threads, and their end before the interpreter tears down.

The loader runs work on threads of its own: a producer per rank stream, document threads,
fetch-ahead downloads. They are daemon threads, so that a trainer that forgets to close a
pipeline still exits. But a daemon thread that is still inside native code when the
interpreter finalizes (a Rust tokenizer call, an Arrow read, a download, each with the GIL
released) is ended by CPython as it takes the GIL back, and that forced unwind through Rust
or C++ frames aborts the process ("FATAL: exception not rethrown", exit status 134): the
trainer's exit code is lost.

So every such thread is registered here with the event (or function) that stops it. At exit,
first thing in ``threading``'s own shutdown (before it waits for non-daemon threads and before
``atexit`` callbacks run), every registered stop is called, then every registered thread is
joined. The stops are all called before any join, so a thread waiting on another (a producer
waiting for a document thread's batch) is released too. Each thread stops within the work
item it is doing (a batch of at most ``CHUNK_CHARS`` of text, one 64 KiB chunk of a
download), so the joins end in well under a second; :data:`EXIT_JOIN_S` bounds them in all,
and a thread still alive after it is named in the log.

Limits: a thread blocked where no stop reaches it (a native call that never returns) cannot
be ended from Python; it is named, and the interpreter then ends it as it would have.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable

from zephon.logs import get_logger

log = get_logger(__name__)

EXIT_JOIN_S = 60.0
"""How long the exit waits, in all, for the registered threads once they were told to stop."""

Stop = Callable[[], None]

_LOCK = threading.Lock()
_LIVE: dict[int, tuple[Stop, Callable[[], Iterable[threading.Thread]]]] = {}
_NEXT = itertools.count()
_EXITING = False


def register(stop: Stop, threads: Callable[[], Iterable[threading.Thread]]) -> int:
    """Have ``stop()`` called and ``threads()`` joined before the interpreter tears down;
    returns a handle for :func:`unregister`. ``stop`` must be safe to call more than once
    and from any thread."""
    handle = next(_NEXT)
    with _LOCK:
        _forget_ended()
        _LIVE[handle] = (stop, threads)
    return handle


def _forget_ended() -> None:
    """Drop the registrations whose threads have all ended (stopped by their owner, who need
    not unregister them); called under the lock, each time a registration is added."""
    for handle, (_, threads) in list(_LIVE.items()):
        if not any(thread.is_alive() for thread in threads()):
            del _LIVE[handle]


def register_thread(stop: threading.Event, thread: threading.Thread) -> int:
    """:func:`register` for one thread that ends once ``stop`` is set."""
    return register(stop.set, lambda: (thread,))


def unregister(handle: int | None) -> None:
    """Forget a registration (its threads have ended or been joined by their owner)."""
    if handle is not None:
        with _LOCK:
            _LIVE.pop(handle, None)


def exiting() -> bool:
    """Whether the interpreter's shutdown has begun stopping the loader's threads."""
    return _EXITING


def stop_all(timeout: float = EXIT_JOIN_S, only: Iterable[int] | None = None
             ) -> list[threading.Thread]:
    """Stop every registered thread (``only`` those of these handles) and wait for them,
    ``timeout`` seconds in all; returns the threads still alive after it."""
    with _LOCK:
        handles = list(_LIVE) if only is None else [h for h in only if h in _LIVE]
        live = [_LIVE.pop(handle) for handle in handles]
    for stop, _ in live:
        try:
            stop()
        except Exception as exc:  # one failing stop must not keep the others running
            log.warning("zephon: stopping a loader thread at exit failed: %r", exc)
    deadline = time.monotonic() + timeout
    alive = []
    me = threading.current_thread()
    for _, threads in live:
        for thread in threads():
            if thread is me or not thread.is_alive():
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                alive.append(thread)
    return alive


def _at_shutdown() -> None:
    global _EXITING
    _EXITING = True
    alive = stop_all()
    if alive:
        log.warning("zephon: loader threads still running at exit after %.0f s: %s",
                    EXIT_JOIN_S, ", ".join(sorted(t.name for t in alive)))


def _install() -> None:
    """Run :func:`_at_shutdown` at the start of ``threading``'s shutdown (``_register_atexit``,
    as ``concurrent.futures`` does), else as the last ``atexit`` callback to run."""
    register_early = getattr(threading, "_register_atexit", None)
    if register_early is not None:
        try:
            register_early(_at_shutdown)
            return
        except RuntimeError:  # imported while the interpreter is already shutting down
            return
    import atexit

    atexit.register(_at_shutdown)


_install()
