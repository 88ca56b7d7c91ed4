"""Fetching ahead: a remote dataset downloads the files of a lane's next units into the shard
cache in the background, so a lane seldom waits for a download.

:class:`FetchAhead` is mixed into the remote datasets (object stores, the Hub); it needs their
``local_file(data_file, ahead=True)`` (download into the cache if needed) and
``display_name``. Each bound dataset has up to :data:`FETCH_THREADS` daemon threads that fetch
the files they are given, each once, in the order given: small files (up to
:data:`SMALL_FILE_BYTES`) several at a time, since a small object costs a round trip more than
its bytes, and larger ones one at a time, as the lane reads them. What they fetch is only
cached, never read from there, so the data a lane reads, and its order, do not depend on them
or on their timing. A fetch that would have to wait for room in the cache (a tight
``limit_bytes`` full of shards being read) is skipped: the lane downloads that file when it
reads it, as under a tight limit a fetched file may also be evicted before it is read. At
interpreter exit the downloads in flight are cancelled (within one 64 KiB chunk) and their
partial files removed.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import zephon.background as background
from zephon.io import cancel
from zephon.logs import get_logger

log = get_logger(__name__)

FETCH_THREADS = 8
"""Downloads a bound dataset runs ahead at once, at most."""
SMALL_FILE_BYTES = 8 << 20
"""Files up to this size are fetched concurrently; larger ones one at a time."""
_POLL_S = 0.1
"""How often a thread waiting its turn for a large file checks for cancellation."""


class Fetches:
    """The background downloads of one bound dataset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: queue.Queue[Any] = queue.Queue()
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.large = threading.Semaphore(1)
        """Held while a file larger than :data:`SMALL_FILE_BYTES` downloads."""
        self.fetched = 0
        """Files fetched so far (downloaded, or found in the cache)."""
        self.skipped = 0
        """Files not fetched ahead because the cache had no room for them then."""

    @property
    def thread(self) -> threading.Thread | None:
        """The first fetching thread, if one was started."""
        return self.threads[0] if self.threads else None


def _stopper(fetches: Fetches) -> tuple[Callable[[], None], Callable[[], tuple[Any, ...]]]:
    """How :mod:`zephon.background` stops ``fetches`` at exit, without keeping it alive: a
    download in flight is cancelled within one 64 KiB chunk and its partial file removed."""
    ref = weakref.ref(fetches)

    def stop() -> None:
        if (live := ref()) is not None:
            live.stop.set()
            for _ in live.threads:
                live.queue.put(None)

    def threads() -> tuple[Any, ...]:
        live = ref()
        return () if live is None else tuple(live.threads)

    return stop, threads


class FetchAhead:
    """``fetch_ahead`` and ``wait_fetches`` for a remote dataset; see the module docstring.
    A copy made for other options (``bound``) must set ``_fetches = None``: it fetches into
    its own cache."""

    _fetches: Fetches | None = None

    @property
    def fetches(self) -> Fetches:
        if self._fetches is None:
            self._fetches = Fetches()
        return self._fetches

    def fetch_ahead(self, data_files: list[Any]) -> None:
        """Download ``data_files`` (DataFiles) into the shard cache in the background."""
        fetches = self.fetches
        with fetches.lock:
            for data_file in data_files:
                if data_file.path not in fetches.seen:
                    fetches.seen.add(data_file.path)
                    fetches.queue.put(data_file)
            wanted = min(FETCH_THREADS, len(fetches.threads) + fetches.queue.qsize())
            while len(fetches.threads) < wanted:
                thread = threading.Thread(target=self._fetch_loop, args=(fetches,),
                                          name="zephon-fetch-ahead", daemon=True)
                first = not fetches.threads
                fetches.threads.append(thread)
                thread.start()
                if first:  # registered running: background forgets ended registrations
                    background.register(*_stopper(fetches))

    def wait_fetches(self) -> None:
        """Block until every file given to :meth:`fetch_ahead` so far is fetched."""
        self.fetches.queue.join()

    def _fetch_loop(self, fetches: Fetches) -> None:
        from zephon.io.cache.shard_cache import NoRoomNow

        with cancel.cancel_when(fetches.stop):
            while not fetches.stop.is_set():
                data_file = fetches.queue.get()
                large = data_file is not None and data_file.size > SMALL_FILE_BYTES
                if fetches.stop.is_set():
                    fetches.queue.task_done()
                    break
                holds_large = False
                try:
                    if data_file is not None:
                        while large and not holds_large:
                            holds_large = fetches.large.acquire(timeout=_POLL_S)
                            cancel.check()
                        with self.local_file(data_file, ahead=True), \
                                fetches.lock:  # type: ignore[attr-defined]
                            fetches.fetched += 1
                except cancel.Cancelled:
                    pass
                except NoRoomNow:
                    with fetches.lock:
                        fetches.skipped += 1
                except Exception as exc:  # the reader downloads it again, and reports it
                    log.info("fetching %s ahead failed: %s",
                             self.display_name(data_file), exc)  # type: ignore[attr-defined]
                finally:
                    if holds_large:
                        fetches.large.release()
                    fetches.queue.task_done()
