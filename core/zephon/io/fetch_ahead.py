"""Fetching ahead: a remote dataset downloads the files of a lane's next units into the shard
cache in the background, so a lane seldom waits for a download.

:class:`FetchAhead` is mixed into the remote datasets (object stores, the Hub); it needs their
``local_file`` (download into the cache if needed) and ``display_name``. One daemon thread per
bound dataset fetches the files it is given, in order, each once. What it fetches is only
cached, never read from there, so the data a lane reads does not depend on it; under a tight
cache limit a fetched file may be evicted before it is read and is then downloaded again. At
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
from zephon.redact import get_logger

log = get_logger(__name__)


class Fetches:
    """The background downloads of one bound dataset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: queue.Queue[Any] = queue.Queue()
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.fetched = 0
        """Files fetched so far (downloaded, or found in the cache)."""


def _stopper(fetches: Fetches) -> tuple[Callable[[], None], Callable[[], tuple[Any, ...]]]:
    """How :mod:`zephon.background` stops ``fetches`` at exit, without keeping it alive: a
    download in flight is cancelled within one 64 KiB chunk and its partial file removed."""
    ref = weakref.ref(fetches)

    def stop() -> None:
        if (live := ref()) is not None:
            live.stop.set()
            live.queue.put(None)

    def threads() -> tuple[Any, ...]:
        live = ref()
        return () if live is None or live.thread is None else (live.thread,)

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
            if fetches.thread is None:
                fetches.thread = threading.Thread(target=self._fetch_loop, args=(fetches,),
                                                  name="zephon-fetch-ahead", daemon=True)
                fetches.thread.start()
                background.register(*_stopper(fetches))

    def wait_fetches(self) -> None:
        """Block until every file given to :meth:`fetch_ahead` so far is fetched."""
        self.fetches.queue.join()

    def _fetch_loop(self, fetches: Fetches) -> None:
        with cancel.cancel_when(fetches.stop):
            while not fetches.stop.is_set():
                data_file = fetches.queue.get()
                try:
                    if data_file is not None:
                        with self.local_file(data_file):  # type: ignore[attr-defined]
                            fetches.fetched += 1
                except Exception as exc:  # the reader downloads it again, and reports it
                    log.info("fetching %s ahead failed: %s",
                             self.display_name(data_file), exc)  # type: ignore[attr-defined]
                finally:
                    fetches.queue.task_done()
