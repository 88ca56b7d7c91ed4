"""An :class:`~zephon.io.storage.ObjectStore` over one bucket of an ``obstore`` store.

``obstore`` (Rust ``object_store`` behind a small Python API: one wheel, no botocore) does
the signing, listing and streaming for S3 and S3-compatible stores, GCS and Azure. Its own
retries are turned off: requests go through :func:`zephon.io.retry.retry_call`, the loop the
Hub uses too (:class:`~zephon.io.store_options.StoreOptions`: ``max_retries``,
``retry_base_wait_s``, ``retry_max_wait_s``), whose waits the loader can cancel (Ctrl-C stops
a retry wait within 0.1 s) and which logs each retry.

Retried with backoff: answers 408, 429, 500, 502, 503 (S3's SlowDown) and 504, and connections
dropped, reset or timed out. A download cut short resumes from the bytes it has (a range
request pinned to the listed version by ``If-Match``), so a reset late in a large object does
not start it over. A refused connection or a host name that does not resolve is retried twice
within about two seconds, then named with the endpoint and the credential source: a mistyped
endpoint fails at once, not after minutes of backoff.

Not retried, and named: a wrong secret (S3's ``SignatureDoesNotMatch``, Azure's failed
authentication), an unknown access key, other 401/403 answers (the bucket, the key and where
the credentials came from), a bucket that does not exist, a missing object (404: deleted or
renamed since it was listed) and 412 (the object changed since it was listed: a checkpoint's
data is not there any more; 416, a range past a shrunken object's end, and an MD5 that still
differs after the retries say the same where a store ignores ``If-Match``).

A failure to write the local copy (a full disk) is the caller's: it propagates unchanged, for
the shard cache to name its root and what to change.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, BinaryIO, TypeVar

from zephon.errors import DataError
from zephon.io import cancel
from zephon.io.content_check import ContentCheck, multipart_count
from zephon.io.printable import printable
from zephon.io.retry import (
    RETRY_STATUS,
    TRANSIENT,
    UNREACHABLE,
    Failure,
    GaveUp,
    RetryPolicy,
    retry_call,
    status_of,
    unreachable_reason,
)
from zephon.io.storage.object_info import ObjectInfo
from zephon.io.store_options import StoreOptions
from zephon.logs import get_logger

log = get_logger(__name__)

CHUNK_BYTES = 64 << 10
"""Bytes a download gathers before it writes them and checks for cancellation: 64 KiB keeps
a Ctrl-C prompt on a link as slow as 100 KB/s."""
PROGRESS_EVERY_S = 10.0
_DROPPED = ("error sending request", "connection", "body error", "timed out", "timeout",
            "reset", "broken pipe", "incomplete")
_CODE = re.compile(r"<Code>\s*([A-Za-z.]+)\s*</Code>")
_WRONG_SECRET = {
    "SignatureDoesNotMatch": "the signature does not match: the secret key is wrong for this "
                             "access key id",
    "AuthenticationFailed": "the store could not authenticate the request: the account key or "
                            "SAS token is wrong",
}
_OTHER_CREDENTIALS = {
    "InvalidAccessKeyId": "the store knows no such access key id",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is not valid",
    "TokenRefreshRequired": "the session token has expired",
}
_MISSING_BUCKET = ("NoSuchBucket", "ContainerNotFound")
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
    import base64

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


def error_code(exc: BaseException) -> str | None:
    """The store's error code (``<Code>SignatureDoesNotMatch</Code>``) of a failed request:
    its own ``code``, else the one in an obstore error's text, else None."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    match = _CODE.search(str(exc))
    return match.group(1) if match else None


class ObstoreBucket:
    """One bucket of an ``obstore`` store; see the module docstring.

    ``credentials`` says where the credentials came from (for 401/403 errors), never what
    they are; ``endpoint`` the service URL and where it came from (for unreachable
    endpoints)."""

    def __init__(self, url: str, store: Any, credentials: str, io: StoreOptions,
                 endpoint: str = ""):
        self.url = url
        self.store = store
        self.credentials = credentials
        self.endpoint = endpoint
        self.io = io
        self.policy = RetryPolicy.of(io)

    def __repr__(self) -> str:
        return f"ObstoreBucket({self.url!r})"

    # -- hooks of a store that can do more ----------------------------------------------------
    def full_listing(self, prefix: str) -> list[ObjectInfo] | None:
        """Every object under ``prefix``, keys the client cannot request included (with their
        :attr:`ObjectInfo.problem`), where the store offers such a listing; else None."""
        return None

    def part_sizes(self, info: ObjectInfo, each: bool) -> list[int] | None:
        """The part sizes of a multipart object (``each``: asked part by part, else from the
        first part with equal parts assumed), where the store tells them; else None."""
        return None

    # -- requests --------------------------------------------------------------------------
    def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        what = f"listing {self.url}/{prefix}"

        def listing() -> list[ObjectInfo]:
            found = []
            try:
                for batch in obstore.list(self.store, prefix=prefix or None, chunk_size=1000):
                    found.extend(ObjectInfo(m["path"], int(m["size"]), version_of(m))
                                 for m in batch)
            except Exception as exc:
                if type(exc).__name__ != "InvalidPathError":
                    raise
                full = self.full_listing(prefix)
                if full is None:
                    raise DataError(_unreadable_key_error(what, exc)) from None
                return full
            return found

        return self._call(listing, what, prefix, listing=True)

    def head(self, key: str) -> ObjectInfo | None:
        """The object ``key`` (its size and version), or None when there is none."""
        import obstore

        def head() -> ObjectInfo | None:
            try:
                meta = obstore.head(self.store, key)
            except FileNotFoundError as exc:
                if error_code(exc) in _MISSING_BUCKET:
                    raise
                return None
            return ObjectInfo(meta["path"], int(meta["size"]), version_of(meta))

        return self._call(head, f"looking up {self.url}/{key}", key, listing=True)

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
                 show_progress: bool = True) -> dict[str, Any] | None:
        """The whole object into ``out``, checked against its version as it arrives: its MD5,
        or for a multipart object its ETag recomputed from the part sizes where the store
        gives them (:meth:`part_sizes`; they are returned for the cache's record). Bytes that
        do not match are downloaded again (a transfer fault), then refused naming the
        object; a multipart ETag that does not match with equal parts assumed is checked
        again with each part's size first."""
        import obstore

        level = logging.INFO if show_progress else logging.DEBUG
        start = last = time.monotonic()
        out.seek(0)
        out.truncate()
        parts = self._parts(info, display, each=False)
        state = {"check": ContentCheck(info.version, info.size, parts), "parts": parts,
                 "each": False}
        log.debug("downloading %s (%d bytes)", display, info.size)

        def start_over(reason: str) -> None:
            out.seek(0)
            out.truncate()
            state["check"] = ContentCheck(info.version, info.size, state["parts"])
            raise _Mismatch(reason)

        def rest() -> None:
            nonlocal last
            done = out.tell()
            check = state["check"]
            if done < info.size:
                options: dict[str, Any] = {"range": (done, info.size)} if done else {}
                if _etag(info):
                    options["if_match"] = _etag(info)
                result = obstore.get(self.store, info.key, options=options)
                for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                    cancel.check()
                    _write(out, chunk)
                    check.update(chunk)
                    now = time.monotonic()
                    if now - last >= PROGRESS_EVERY_S:
                        last = now
                        log.log(level, "downloading %s: %.0f%%", display,
                                100 * out.tell() / max(info.size, 1))
                if out.tell() != info.size:
                    raise _Dropped(f"{display}: the answer ended at byte {out.tell()} of "
                                   f"{info.size}")
            if check.ok():
                return
            if state["parts"] is not None and not state["each"]:
                state["each"] = True  # parts of unequal sizes, or bytes changed in transit
                state["parts"] = self._parts(info, display, each=True)
                start_over("the bytes received do not match its multipart ETag with equal "
                           "parts; asking each part's size")
            start_over(f"the bytes received do not match its "
                       f"{_checked_by(info, state['parts'])} ({info.version})")

        self._call(rest, f"downloading {display}", info.key)
        seconds = time.monotonic() - start
        log.log(level if seconds >= PROGRESS_EVERY_S else logging.DEBUG,
                "downloaded %s: %d bytes in %.2f s", display, info.size, seconds)
        return {"parts": state["parts"]} if state["parts"] else None

    def _parts(self, info: ObjectInfo, display: str, each: bool) -> list[int] | None:
        """The part sizes of a multipart object when the store gives them, else None (its
        ETag then checks only the size; logged once a bucket)."""
        if multipart_count(info.version) is None:
            return None
        parts = self.part_sizes(info, each)
        if parts is None and self.url not in _UNCHECKED:
            _UNCHECKED.add(self.url)
            log.warning("%s: multipart objects of %s (such as %s) are checked by size only: "
                        "recomputing their ETag needs their part sizes, which this store or "
                        "these credentials (%s) do not give", display, self.url, info.key,
                        self.credentials)
        return parts

    # -- retries and errors ------------------------------------------------------------------
    def _call(self, fn: Callable[[], T], what: str, key: str, listing: bool = False) -> T:
        try:
            return retry_call(fn, what, self.policy, self._failure)
        except LocalWriteError as exc:
            raise exc.error from None
        except GaveUp as gave_up:
            raise self._gave_up(gave_up) from None
        except (cancel.Cancelled, DataError):
            raise
        except Exception as exc:  # obstore raises its own classes, sorted by _explain
            raise self._explain(exc, what, key, listing) from None

    def _failure(self, exc: Exception) -> Failure | None:
        """How ``exc`` is retried, or None when it is not (see the module docstring)."""
        if isinstance(exc, _Dropped):
            return Failure(TRANSIENT, str(exc))
        if isinstance(exc, cancel.Cancelled | DataError | LocalWriteError):
            return None
        reason = unreachable_reason(exc)
        if reason is not None:
            return Failure(UNREACHABLE, reason)
        status = status_of(exc)
        if status in RETRY_STATUS:
            return Failure(TRANSIENT, f"HTTP {status}")
        if status is None and type(exc).__name__ not in _NOT_RETRIED and any(
                word in str(exc).lower() for word in _DROPPED):
            return Failure(TRANSIENT, _first_line(exc))
        return None

    def _gave_up(self, gave_up: GaveUp) -> DataError:
        if gave_up.failure.kind == UNREACHABLE:
            return DataError(
                f"{gave_up.what}: cannot connect to {self.endpoint or self.url} "
                f"({gave_up.failure.reason}, {gave_up.retries} retries). Check the endpoint "
                f"and that the store is up; credentials: {self.credentials}")
        if isinstance(gave_up.last, _Mismatch):
            return DataError(f"{gave_up.what}: {gave_up.last}, in each of "
                             f"{gave_up.retries + 1} downloads: the object, or the network "
                             "path to it, alters its bytes; it is not used")
        return DataError(f"{gave_up.what}: failed after {gave_up.retries} retries: "
                         f"{_first_line(gave_up.last)}")

    def _explain(self, exc: BaseException, what: str, key: str, listing: bool) -> Exception:
        """Our error for ``exc``, which is not retried."""
        name = type(exc).__name__
        status = status_of(exc)
        code = error_code(exc)
        place = f"bucket {self.url}, key {key!r}"
        credentials = f"Credentials used: {self.credentials}"
        if code in _WRONG_SECRET:
            return DataError(f"{what}: {_WRONG_SECRET[code]} ({place}; {code}). "
                             f"{credentials}. Check the secret, or set the right one")
        if code in _OTHER_CREDENTIALS:
            return DataError(f"{what}: {_OTHER_CREDENTIALS[code]} ({place}; {code}). "
                             f"{credentials}")
        if "failed to authenticate the request" in str(exc):
            return DataError(f"{what}: {_WRONG_SECRET['AuthenticationFailed']} ({place}). "
                             f"{credentials}. Check the key, or set the right one")
        if name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
            return DataError(f"{what}: access denied ({place}). {credentials}. Check that "
                             "they may read this bucket, or set other ones")
        not_found = (isinstance(exc, FileNotFoundError) or name == "NotFoundError"
                     or status == 404)
        if not_found and (listing or code in _MISSING_BUCKET):
            return DataError(f"{what}: the bucket {self.url} does not exist"
                             f"{' at ' + self.endpoint if self.endpoint else ''} (or these "
                             f"credentials cannot see it: {self.credentials})")
        if not_found:
            return DataError(f"{what}: no such object ({place}); it was deleted or renamed "
                             "since it was listed, or the path names the wrong bucket")
        if name in ("PreconditionError", "NotModifiedError") or status in (412, 416):
            # 416: a range inside the listed size is past the object's end; it shrank
            return DataError(f"{what}: the object changed since it was listed ({place}); a "
                             "run reads the versions it listed (and a checkpoint names them): "
                             "restore that version, or start a new run over the new data")
        if status is not None:
            return DataError(f"{what}: HTTP {status} ({place}): {_first_line(exc)}")
        return DataError(f"{what}: {_first_line(exc)} ({place})")


_NOT_RETRIED = frozenset({"PermissionDeniedError", "UnauthenticatedError", "NotFoundError",
                          "PreconditionError", "NotModifiedError", "InvalidPathError",
                          "FileNotFoundError", "ValueError"})


_UNCHECKED: set[str] = set()
"""Buckets whose multipart objects were found unverifiable (warned once)."""


def _checked_by(info: ObjectInfo, parts: list[int] | None) -> str:
    kind = info.version.partition(":")[0]
    if kind == "md5":
        return "MD5"
    return "multipart ETag" if parts else "size"


def _unreadable_key_error(what: str, exc: BaseException) -> str:
    """Our words for a listing that met a key the client cannot represent."""
    match = re.search(r'Path "(.*?)"(?: contained|: Encountered)', str(exc), re.DOTALL)
    key = printable(match.group(1)) if match else "?"
    return (f"{what}: the key {key!r} has {unreadable_reason(match.group(1) if match else '')}"
            ", which the object-store client cannot request, and this store's listing cannot "
            "leave it out: name a path that does not cover it (a narrower prefix or glob), or "
            "rename the object")


def unreadable_reason(key: str) -> str:
    """Why the client cannot request ``key`` (it is not a path ``object_store`` accepts)."""
    segments = key.rstrip("/").split("/")
    if "" in segments:
        return "an empty path segment (//)"
    if "." in segments or ".." in segments:
        return "a '.' or '..' path segment"
    if not key.isprintable():
        return "a control character"
    return "characters the client does not accept in a path"


def readable(key: str) -> bool:
    """Whether the client can request ``key``: obstore's own path rules, applied locally (to
    an empty in-memory store)."""
    import obstore
    from obstore.store import MemoryStore

    global _PROBE
    if _PROBE is None:
        _PROBE = MemoryStore()
    try:
        obstore.head(_PROBE, key)
    except FileNotFoundError:
        return True
    except ValueError:
        return False
    return True


_PROBE: Any = None


class _Dropped(Exception):
    """An answer that ended early, or whose bytes do not match (retried)."""


class _Mismatch(_Dropped):
    """Bytes that do not match the object's version (retried: a fault in transit)."""


class LocalWriteError(Exception):
    """Writing the local copy failed (``error``, an ``OSError``): not the store's fault, so
    not retried; re-raised unchanged for the caller."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def _write(out: BinaryIO, chunk: Any) -> None:
    try:
        out.write(chunk)
    except OSError as exc:
        raise LocalWriteError(exc) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
