"""An :class:`~zephon.io.storage.ObjectStore` over one bucket of an ``obstore`` store.

``obstore`` (Rust ``object_store`` behind a small Python API: one wheel, no botocore) does
the signing, listing and streaming for S3 and S3-compatible stores, and would do the same for
GCS and Azure. Its own retries are turned off: this module retries, so that every scheme
retries the same way as ``hf://`` (:class:`~zephon.io.store_options.StoreOptions`:
``max_retries``, ``retry_base_wait_s``, ``retry_max_wait_s``), waits in ways the loader can
cancel (Ctrl-C stops a retry wait within 0.1 s) and logs each retry.

Retried: answers 408, 429, 500, 502, 503 (S3's SlowDown) and 504, and dropped connections,
with the wait ``min(max_wait_s, base_wait_s * 2**n)`` scaled by a random factor in [0.5, 1].
A download cut short resumes from the bytes it has (a range request pinned to the listed
version by ``If-Match``), so a reset late in a large object does not start it over.

Not retried, and named: 401/403 (the bucket, the key and where the credentials came from),
404 (the key, the bucket) and 412 (the object changed since it was listed: a checkpoint's
data is not there any more; 416, a range past a shrunken object's end, and an MD5 that still
differs after the retries say the same where a store ignores ``If-Match``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import random
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, BinaryIO, TypeVar

from zephon.errors import DataError
from zephon.io import cancel
from zephon.io.storage import ObjectInfo
from zephon.io.store_options import StoreOptions
from zephon.redact import get_logger

log = get_logger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
CHUNK_BYTES = 64 << 10
"""Bytes a download gathers before it writes them and checks for cancellation: 64 KiB keeps
a Ctrl-C prompt on a link as slow as 100 KB/s."""
PROGRESS_EVERY_S = 10.0
_STATUS = re.compile(r"status(?: code)?:? (\d{3})", re.IGNORECASE)
_DROPPED = ("error sending request", "connection", "body error", "timed out", "timeout",
            "reset", "broken pipe", "incomplete")
T = TypeVar("T")


def client_options(io: StoreOptions, endpoint: str | None) -> dict[str, Any]:
    """obstore client options: ``io``'s timeouts, and plain HTTP allowed for an ``http://``
    endpoint (an emulator, a store on a private network)."""
    options: dict[str, Any] = {"timeout": timedelta(seconds=io.timeout_s),
                               "connect_timeout": timedelta(seconds=min(io.timeout_s, 30))}
    if endpoint:
        options["allow_http"] = endpoint.startswith("http://")
    return options


NO_RETRIES = {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}
"""obstore's own retries, off: :class:`ObstoreBucket` retries (the same policy and
cancellation as every scheme)."""


def version_of(meta: dict[str, Any]) -> str:
    """The :attr:`ObjectInfo.version` of an ``obstore`` listing entry: ``md5:<hex>`` for an
    ETag that is a bare MD5 (a single-part upload; hex, or base64 as GCS gives it), else
    ``etag:<etag>``."""
    etag = (meta.get("e_tag") or "").strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag):
        return f"md5:{etag}"
    if re.fullmatch(r"[A-Za-z0-9+/]{22}==", etag):  # an MD5 in base64 (GCS's JSON form)
        return f"md5:{base64.b64decode(etag).hex()}"
    if etag:
        return f"etag:{etag}"
    return f"etag:{meta.get('version') or ''}:{meta.get('size')}"


def _etag(info: ObjectInfo) -> str:
    kind, _, value = info.version.partition(":")
    return f'"{value}"' if kind in ("md5", "etag") and value else ""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an ``obstore`` error reports, else None."""
    match = _STATUS.search(str(exc))
    return int(match.group(1)) if match else None


class ObstoreBucket:
    """One bucket of an ``obstore`` store; see the module docstring.

    ``credentials`` says where the credentials came from (for 401/403 errors), never what
    they are."""

    def __init__(self, url: str, store: Any, credentials: str, io: StoreOptions):
        self.url = url
        self.store = store
        self.credentials = credentials
        self.io = io

    def __repr__(self) -> str:
        return f"ObstoreBucket({self.url!r})"

    # -- requests --------------------------------------------------------------------------
    def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        def listing() -> list[ObjectInfo]:
            found = []
            for batch in obstore.list(self.store, prefix=prefix or None, chunk_size=1000):
                found.extend(ObjectInfo(m["path"], int(m["size"]), version_of(m))
                             for m in batch)
            return found

        return self._call(listing, f"listing {self.url}/{prefix}", prefix)

    def read_range(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        import obstore

        def read() -> bytes:
            options: dict[str, Any] = {"range": (start, stop)}
            if _etag(info):
                options["if_match"] = _etag(info)
            data = bytes(obstore.get(self.store, info.key, options=options).bytes())
            if len(data) != stop - start:
                raise _Dropped(f"received {len(data)} of {stop - start} bytes")
            return data

        return self._call(read, f"reading bytes {start}..{stop} of {self.url}/{info.key}",
                          info.key)

    def download(self, info: ObjectInfo, out: BinaryIO, display: str,
                 show_progress: bool = True) -> None:
        import obstore

        level = logging.INFO if show_progress else logging.DEBUG
        start = last = time.monotonic()
        out.seek(0)
        out.truncate()
        kind, _, expected = info.version.partition(":")
        digest = [hashlib.md5(usedforsecurity=False)] if kind == "md5" else None
        log.log(level, "downloading %s (%d bytes)", display, info.size)

        def rest() -> None:
            nonlocal last
            done = out.tell()
            if done >= info.size:
                return
            options: dict[str, Any] = {"range": (done, info.size)} if done else {}
            if _etag(info):
                options["if_match"] = _etag(info)
            result = obstore.get(self.store, info.key, options=options)
            for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                cancel.check()
                out.write(chunk)
                if digest:
                    digest[0].update(chunk)
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY_S:
                    last = now
                    log.log(level, "downloading %s: %.0f%%", display,
                            100 * out.tell() / max(info.size, 1))
            if out.tell() != info.size:
                raise _Dropped(f"{display}: the answer ended at byte {out.tell()} of "
                               f"{info.size}")
            if digest and digest[0].hexdigest() != expected:
                out.seek(0)
                out.truncate()
                digest[0] = hashlib.md5(usedforsecurity=False)
                raise _Dropped(f"{display}: the bytes received do not match its MD5 "
                               f"{expected}")

        self._call(rest, f"downloading {display}", info.key)
        log.log(level, "downloaded %s: %d bytes in %.2f s", display, info.size,
                time.monotonic() - start)

    # -- retries and errors ------------------------------------------------------------------
    def _call(self, fn: Callable[[], T], what: str, key: str) -> T:
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:  # obstore raises its own classes, sorted by _fatal
                fatal = self._fatal(exc, what, key)
                if fatal is not None:
                    raise fatal from None
                if attempt >= self.io.max_retries:
                    raise DataError(f"{what}: failed after {attempt} retries: "
                                    f"{_first_line(exc)}") from None
                wait = min(self.io.retry_max_wait_s,
                           self.io.retry_base_wait_s * 2 ** attempt) * random.uniform(0.5, 1)
                status = status_of(exc)
                log.warning("%s: %s; retry %d of %d in %.2f s", what,
                            f"HTTP {status}" if status else _first_line(exc), attempt + 1,
                            self.io.max_retries, wait)
                cancel.sleep(wait)
                attempt += 1

    def _fatal(self, exc: BaseException, what: str, key: str) -> Exception | None:
        """The error to raise for ``exc`` at once, or None to retry it."""
        if isinstance(exc, cancel.Cancelled | DataError | KeyboardInterrupt):
            return exc if isinstance(exc, Exception) else None
        if isinstance(exc, _Dropped):
            return None
        name = type(exc).__name__
        status = status_of(exc)
        place = f"bucket {self.url}, key {key!r}"
        if name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
            return DataError(f"{what}: access denied ({place}). Credentials used: "
                             f"{self.credentials}. Check that they may read this bucket, or "
                             "set other ones")
        if isinstance(exc, FileNotFoundError) or name == "NotFoundError" or status == 404:
            return DataError(f"{what}: no such object ({place}); it was deleted or renamed "
                             "since it was listed, or the path names the wrong bucket")
        if name in ("PreconditionError", "NotModifiedError") or status in (412, 416):
            # 416: a range inside the listed size is past the object's end; it shrank
            return DataError(f"{what}: the object changed since it was listed ({place}); a "
                             "run reads the versions it listed (and a checkpoint names them): "
                             "restore that version, or start a new run over the new data")
        if status in RETRY_STATUS or (status is None and any(
                word in str(exc).lower() for word in _DROPPED)):
            return None
        if status is not None:
            return DataError(f"{what}: HTTP {status} ({place}): {_first_line(exc)}")
        return DataError(f"{what}: {_first_line(exc)} ({place})")


class _Dropped(Exception):
    """An answer that ended early (retried)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
