"""The shard cache: whole remote files, downloaded once per node, kept within a size limit.

Layout under ``root``::

    shards/<key>            complete, verified files: the only files ever handed to readers
    partial/<key>           downloads in progress, renamed into shards/ once complete and verified
    partial/<key>.reserve   the bytes promised to that download
    state/<key>.pin         one small file a shard: readers hold a shared lock on it while they
                            use the shard; its modification time is the shard's last use; it holds
                            the shard's record (its size, modification time and inode when last
                            verified, its version, part sizes where the check needs them, what it
                            is)
    locks/<nn>              256 download locks, a shard's chosen by its key: held by the process
                            that downloads or re-checks the shard
    cache.lock              serializes space accounting and eviction; holds the ledger, the bytes
                            of complete shards

So a shard costs two files (itself and its pin), whatever the number of shards; a download in
progress two more. A key is a prefix of the file's content hash plus its name, so identical
content is stored once. "Shared by a node" means: every process of one machine that uses the
same ``root`` on a local file system (locks are ``flock``, see :mod:`zephon.io.cache.locks`).

Opening a file:

1. Pin it (shared lock on its pin, taken before anything else, so a shard about to be read
   cannot be evicted) and record the time of use.
2. A shard whose stat matches its pin's record is used as it is.
3. Otherwise take its download lock; processes wanting the same shard wait here, so it is
   downloaded once. A shard that exists but whose stat changed is hashed again; one whose size
   or hash does not match the listing is discarded.
4. Make room under ``cache.lock``. The disk must hold the file besides what other downloads in
   progress still have to write (else an error naming the root and what to change). Under a
   ``limit_bytes``, the bytes of complete shards plus live reservations must stay within it:
   when the ledger says they may not, the shards are counted again and the least recently used
   evicted, skipping any a reader has pinned; when only pinned shards are left, wait for readers
   to finish (up to ``space_wait_s``), then fail.
5. Reserve the bytes, download into ``partial/``, fsync, check size and content hash (the
   fetch does), add the bytes to the ledger and rename into ``shards/`` (atomic), write the
   record, drop the reservation.

The ledger is an upper bound of the bytes in ``shards/``: bytes are added before a shard
appears and taken off after one is removed, so a process killed in between leaves it too high,
never too low, and the next count corrects it. A download counts the shards only when the
ledger says the limit may be reached, so a download costs the same whatever the number of
shards; a cache at its limit counts them at each download that must evict (one directory scan).

Safety (:mod:`zephon.io.cache.private_files`): the root and its folders are private to their user
(created with mode 0700; one owned by another user, or writable by group or others, is refused),
nothing inside the root is opened through a symbolic link, fresh files are created exclusively,
and a full, read-only or refused disk gives an error that names the path and what to do.
Eviction and listing skip whatever in ``shards/`` is not a regular file (logged once).
Read-only commands (:func:`cache_entries`, :func:`verify_cache`) create and write nothing, so
they work on a read-only cache.

Limits: a killed download leaves only a ``partial/`` file and its reservation; both are removed
by the next accounting once the dead process's download lock is free, and nothing in
``partial/`` is ever read. Two shards whose keys share a download lock are downloaded one after
the other. The limit counts shard bytes, not the small state files. Corruption that rewrites a
file changes its stat and is caught; corruption that leaves size, modification time and inode
unchanged (silent disk bit rot) is not, except by :func:`verify_cache`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import zephon.artifacts as artifacts
from zephon.errors import ConfigError, DataError, ZephonError
from zephon.field_checks import need_fields, need_int, need_list, need_str
from zephon.io import cancel
from zephon.io.cache.locks import FileLock, is_locked
from zephon.io.cache.private_files import (
    open_fresh,
    private_dir,
    read_bytes,
    reported,
    write_fresh,
)
from zephon.io.content_check import ContentCheck
from zephon.io.store_options import (
    LIMIT_NAMES,
    LIMIT_OPTION,
    ROOT_OPTION,
    CacheOptions,
    StoreOptions,
    default_cache_root,
)
from zephon.logs import get_logger

__all__ = ["CacheEntry", "CacheStats", "CachedFile", "ContentCheck", "NoRoomNow", "ShardCache",
           "cache_entries", "prune_cache", "verify_cache"]

log = get_logger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SPACE_POLL_S = 0.05
_SKIPPED: set[str] = set()
DOWNLOAD_LOCKS = 256
"""Download locks in ``locks/``; a shard's is chosen by its key."""
_FOLDERS = ("shards", "partial", "state", "locks")


@dataclass(frozen=True, slots=True)
class CachedFile:
    """What the cache needs to know about a remote file."""

    name: str
    """File name (kept as the suffix of the key, for readability and format detection)."""
    size: int
    """Size in bytes, from the listing."""
    version: str
    """Content hash, see :class:`~zephon.io.content_check.ContentCheck`."""
    display: str
    """How errors and logs name the file."""

    @property
    def key(self) -> str:
        digest = self.version.partition(":")[2]
        if not re.fullmatch(r"[0-9a-f]{16,}", digest):
            digest = hashlib.sha256(self.version.encode()).hexdigest()
        name = _UNSAFE.sub("_", self.name)[-80:]
        return f"{digest[:32]}-{name}"


@dataclass
class CacheStats:
    """What this process's cache object did (for logs and tests)."""

    hits: int = 0
    downloads: int = 0
    downloaded_bytes: int = 0
    download_seconds: float = 0.0
    evictions: int = 0
    discarded: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        """Add to the counts (threads that fetch ahead share them)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class NoRoomNow(ZephonError):
    """A fetch ahead found no room in the cache without waiting (see ``ahead``)."""


Fetch = Callable[[BinaryIO], Any]
"""``fetch(out)`` writes the file to ``out`` and checks it; it may return a dict of fields for
the shard's record that a later check needs (``{"parts": [...]}``, a multipart object's part
sizes); anything else it returns is ignored."""


class ShardCache:
    """A size-limited, node-shared cache of whole files; see the module docstring.

    ``read_only``: open an existing cache without creating or writing anything (for listing
    and checking it); such an object must not :meth:`open` shards."""

    def __init__(self, options: CacheOptions, *, read_only: bool = False):
        if not options.enabled:
            raise ConfigError("ShardCache needs CacheOptions(enabled=True)")
        self.root = (Path(options.root).expanduser() if options.root is not None
                     else default_cache_root())
        self.limit = options.limit_bytes
        self.space_wait_s = options.space_wait_s
        self.stats = CacheStats()
        if read_only:
            if not (self.root / "shards").is_dir():
                raise ConfigError(f"{self.root} is not a Zephon shard cache (no shards/ "
                                  "directory)")
            return
        with reported("shard cache root", self.root):
            self.root.parent.mkdir(parents=True, exist_ok=True)
        private_dir(self.root, "shard cache root", allow_link=True)
        for sub in _FOLDERS:
            private_dir(self.root / sub, "shard cache folder")
        probe = self.root / "state" / f".probe-{os.getpid()}"
        write_fresh(probe, b"", "shard cache root")
        probe.unlink()

    # -- paths ----------------------------------------------------------------------------
    def shard_path(self, key: str) -> Path:
        return self.root / "shards" / key

    def _pin(self, key: str) -> Path:
        return self.root / "state" / f"{key}.pin"

    def _reservation(self, key: str) -> Path:
        return self.root / "partial" / f"{key}.reserve"

    def _download_lock(self, key: str) -> Path:
        return download_lock(self.root, key)

    def used_bytes(self) -> int:
        """Bytes of complete shards now in the cache."""
        return sum(size for _, size, _ in self._complete())

    # -- opening --------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, item: CachedFile, fetch: Fetch, *, ahead: bool = False) -> Iterator[str]:
        """A local path to ``item``, downloaded by ``fetch(out)`` if needed; the shard stays
        pinned (never evicted) until the ``with`` block ends. ``ahead``: a fetch ahead of the
        reader, which raises :class:`NoRoomNow` instead of waiting for room."""
        if self.limit is not None and item.size > self.limit:
            raise ConfigError(
                f"{item.display} is {item.size} bytes, more than the shard cache's "
                f"limit_bytes={self.limit}; raise {LIMIT_OPTION}")
        key = item.key
        pin = FileLock(self._pin(key), shared=True)
        pin.acquire()
        try:
            pin.touch()
            path = self.shard_path(key)
            if self._trusted(pin, path, item) is not None:
                self.stats.add(hits=1)
            else:
                with FileLock(self._download_lock(key)):
                    self._ensure(pin, path, item, fetch, ahead)
            yield str(path)
        finally:
            pin.release()

    def _trusted(self, pin: FileLock, path: Path, item: CachedFile) -> dict[str, Any] | None:
        """The shard's record when its stat still matches it (the shard is as verified), else
        None."""
        record = _record_of(pin.read())
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if (record is None or not stat.S_ISREG(st.st_mode) or record.get("version") != item.version
                or record.get("size") != item.size or _stat_fields(st) != {
                    k: record.get(k) for k in ("size", "mtime_ns", "ino")}):
            return None
        return record

    def _ensure(self, pin: FileLock, path: Path, item: CachedFile, fetch: Fetch,
                ahead: bool) -> None:
        if self._trusted(pin, path, item) is not None:
            self.stats.add(hits=1)
            return
        held = _lock_number(item.key)
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            old = _record_of(pin.read()) or {}
            parts = old.get("parts") if old.get("version") == item.version else None
            if (stat.S_ISREG(st.st_mode) and st.st_size == item.size
                    and ContentCheck.of_file(path, item.version, item.size, parts)):
                self._record(pin, path, item, {"parts": parts} if parts else None)
                _forget_old_layout(self.root, item.key)
                self.stats.add(hits=1)
                return
            log.warning("shard cache: %s at %s is not a regular file matching its listed "
                        "size/hash; discarding it and downloading it again", item.display, path)
            self.stats.add(discarded=1)
            with FileLock(self.root / "cache.lock") as ledger:
                with reported("cached shard", path):
                    path.unlink(missing_ok=True)
                _ledger_add(ledger, -st.st_size if stat.S_ISREG(st.st_mode) else 0)
        pin.write(b"", "shard cache record")
        self._reserve(item, held, ahead)
        partial = self.root / "partial" / item.key
        try:
            start = time.monotonic()
            with reported(f"partial download of {item.display} at", partial,
                          lambda: self._space_advice(item)):
                with os.fdopen(open_fresh(partial), "wb") as out:
                    returned = fetch(out)
                    extra = returned if isinstance(returned, dict) else None
                    out.flush()
                    os.fsync(out.fileno())
                written = os.lstat(partial).st_size
                if written != item.size:
                    raise DataError(f"{item.display}: download wrote {written} bytes, the "
                                    f"listing says {item.size}")
                with FileLock(self.root / "cache.lock") as ledger:
                    _ledger_add(ledger, item.size)
                    os.replace(partial, path)
            self._record(pin, path, item, extra)
            self.stats.add(downloads=1, downloaded_bytes=item.size,
                           download_seconds=time.monotonic() - start)
        finally:
            partial.unlink(missing_ok=True)
            self._reservation(item.key).unlink(missing_ok=True)

    def _space_advice(self, item: CachedFile) -> str:
        """What to do when ``item`` does not fit on the disk (for :func:`reported`)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = 0
        return (f"{item.display} needs {item.size} bytes; {free} bytes are free and "
                f"{self.used_bytes()} bytes of shards are cached in shard cache root "
                f"{self.root}. {self._advice(item, free)}")

    def _advice(self, item: CachedFile, free: int) -> str:
        """How to make a disk of ``free`` bytes hold ``item`` from now on."""
        limit = (f"limit_bytes={self.limit} is more than the disk holds: lower it below "
                 f"{self.used_bytes() + free} bytes" if self.limit is not None else
                 "No limit_bytes is set: set one below what the disk holds")
        return (f"{limit} ({LIMIT_NAMES}), free at least {max(item.size - free, 0)} bytes on "
                f"that disk, or choose another cache {ROOT_OPTION}.")

    def _record(self, pin: FileLock, path: Path, item: CachedFile,
                extra: dict[str, Any] | None) -> None:
        record = {"version": item.version, **_stat_fields(os.lstat(path)),
                  "display": item.display, **(extra or {})}
        pin.write(artifacts.dump(RECORD_KIND, record), "shard cache record")

    # -- space ----------------------------------------------------------------------------
    def _reserve(self, item: CachedFile, held: int, ahead: bool) -> None:
        """Wait until ``item`` fits, then reserve its bytes; ``held`` is the download lock
        this thread holds; ``ahead``: raise :class:`NoRoomNow` instead of waiting."""
        deadline = time.monotonic() + self.space_wait_s
        while True:
            with FileLock(self.root / "cache.lock") as ledger:
                if self._make_room(item, ledger, held):
                    write_fresh(self._reservation(item.key), str(item.size).encode(),
                                "shard cache reservation")
                    return
            if ahead:
                raise NoRoomNow(f"no room for {item.display} in the shard cache now")
            if time.monotonic() >= deadline:
                raise DataError(
                    f"shard cache {self.root} is full: {item.display} ({item.size} bytes) does "
                    f"not fit in limit_bytes={self.limit} while the other cached shards are "
                    f"being read; waited {self.space_wait_s:.0f} s. Raise {LIMIT_OPTION}: it "
                    "must hold every shard read at the same time on this node.")
            cancel.sleep(_SPACE_POLL_S)

    def _make_room(self, item: CachedFile, ledger: FileLock, held: int) -> bool:
        """Evict until ``item`` fits; True when it does. Runs under cache.lock (``ledger``).
        A disk that cannot hold it is an error at once."""
        reserved, unwritten = self._live_reservations(exclude=item.key, held=held)
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = None
        if free is not None and item.size > free - unwritten:
            raise DataError(
                f"shard cache root {self.root}: the disk is full for {item.display}: it needs "
                f"{item.size} bytes, {free} bytes are free and downloads in progress will "
                f"write {unwritten} more. {self._advice(item, free - unwritten)}")
        if self.limit is None:
            return True
        counted = _ledger_of(ledger)
        if counted is not None and counted + reserved + item.size <= self.limit:
            return True
        complete = self._complete()
        used = sum(size for _, size, _ in complete)
        for key, size, _ in sorted(complete, key=lambda entry: entry[2]):
            if used + reserved + item.size <= self.limit:
                break
            if key != item.key and self._evict(key, held):
                used -= size
        _ledger_set(ledger, used)
        return used + reserved + item.size <= self.limit

    def _complete(self) -> list[tuple[str, int, float]]:
        """(key, size, last use) of every complete shard; whatever is not a regular file is
        skipped (and logged once per process)."""
        with os.scandir(self.root / "state") as entries:
            used_at = {}
            for entry in entries:
                if entry.name.endswith(".pin"):
                    with contextlib.suppress(FileNotFoundError):
                        used_at[entry.name[:-4]] = entry.stat(follow_symlinks=False).st_mtime
        out = []
        with os.scandir(self.root / "shards") as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    if entry.path not in _SKIPPED:
                        _SKIPPED.add(entry.path)
                        log.warning("shard cache: %s is not a regular file; it is not a shard "
                                    "and is left alone (remove it to silence this)", entry.path)
                    continue
                out.append((entry.name, st.st_size, used_at.get(entry.name, st.st_mtime)))
        return out

    def _live_reservations(self, exclude: str, held: int | None) -> tuple[int, int]:
        """(bytes reserved, bytes not yet written) by other downloads in progress; drops the
        reservations of dead processes (their download lock is free, or is ``held`` by this
        thread)."""
        reserved = unwritten = 0
        with os.scandir(self.root / "partial") as entries:
            names = [e.name for e in entries if e.name.endswith(".reserve")]
        for name in names:
            key = name[: -len(".reserve")]
            if key == exclude:
                continue
            lock = FileLock(self._download_lock(key))
            if _lock_number(key) == held or lock.acquire(blocking=False):
                try:
                    (self.root / "partial" / key).unlink(missing_ok=True)
                    self._reservation(key).unlink(missing_ok=True)
                    log.info("shard cache: removed the leftovers of an interrupted download "
                             "of %s", key)
                finally:
                    lock.release()
                continue
            try:
                size = int(read_bytes(self._reservation(key)) or 0)
            except (OSError, ValueError):
                continue
            try:
                written = os.lstat(self.root / "partial" / key).st_size
            except OSError:
                written = 0
            reserved += size
            unwritten += max(size - written, 0)
        return reserved, unwritten

    def _evict(self, key: str, held: int | None = None) -> bool:
        """Remove the shard ``key`` unless a reader pins it or another process downloads it
        (``held``: the download lock this thread holds already). The caller accounts for the
        bytes in the ledger."""
        pin = FileLock(self._pin(key))
        if not pin.acquire(blocking=False):
            return False
        lock = FileLock(self._download_lock(key))
        if _lock_number(key) != held and not lock.acquire(blocking=False):
            pin.release()
            return False
        try:
            self.shard_path(key).unlink(missing_ok=True)
            _forget_old_layout(self.root, key)
            self.stats.add(evictions=1)
            log.debug("shard cache: evicted %s", key)
        finally:
            lock.release()
            pin.delete()
        return True


def _lock_number(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:2], "big") % DOWNLOAD_LOCKS


def download_lock(root: Path, key: str) -> Path:
    """The download lock of the shard ``key`` in the cache at ``root``."""
    return root / "locks" / f"{_lock_number(key):02x}"


def _stat_fields(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


RECORD_KIND = "zephon.shard-record"
LEDGER_KIND = "zephon.shard-ledger"


def _record_of(data: bytes) -> dict[str, Any] | None:
    """A shard's record from its pin's bytes (a sealed artifact, :mod:`zephon.artifacts`);
    None when there is none, or it is half written, damaged or changed: the shard is then
    checked again as if it had none."""
    if not data:
        return None
    try:
        return artifacts.load(data, RECORD_KIND, "shard cache record", _checked_record)
    except artifacts.ArtifactError:
        return None


def _checked_record(record: dict[str, Any]) -> dict[str, Any]:
    need_fields(record, "", ("version", "size", "mtime_ns", "ino", "display"), ("parts",))
    need_str(record["version"], "version")
    need_str(record["display"], "display")
    for name in ("size", "mtime_ns", "ino"):
        need_int(record[name], name)
    if "parts" in record:
        for i, size in enumerate(need_list(record["parts"], "parts")):
            need_int(size, f"parts[{i}]", low=1)
    return record


def _forget_old_layout(root: Path, key: str) -> None:
    """Remove what earlier versions kept beside a shard (a record and a lock file each)."""
    for kind in ("ok", "lock"):
        with contextlib.suppress(OSError):
            (root / "state" / f"{key}.{kind}").unlink()


def _ledger_of(ledger: FileLock) -> int | None:
    """The bytes the ledger counts; None where it holds none (or a damaged count: the next
    count sets it)."""
    data = ledger.read()
    if not data:
        return None
    try:
        return artifacts.load(data, LEDGER_KIND, "shard cache ledger",
                              lambda f: need_int(need_fields(f, "", ("shard_bytes",))
                                                 ["shard_bytes"], "shard_bytes"))
    except artifacts.ArtifactError:
        return None


def _ledger_set(ledger: FileLock, shard_bytes: int) -> None:
    ledger.write(artifacts.dump(LEDGER_KIND, {"shard_bytes": shard_bytes}),
                 "shard cache ledger")


def _ledger_add(ledger: FileLock, delta: int) -> None:
    """Move the ledger by ``delta`` bytes (an unknown ledger stays unknown: the next count
    sets it)."""
    counted = _ledger_of(ledger)
    if counted is not None and delta:
        _ledger_set(ledger, max(counted + delta, 0))


@dataclass(frozen=True)
class CacheEntry:
    """One cached shard, as ``zephon cache ls`` shows it."""

    key: str
    size: int
    last_use: float
    """Seconds since the epoch of the last open."""
    display: str
    """What it is (``hf://org/name@commit/path``), when recorded."""
    in_use: bool
    """A reader holds it open (it cannot be evicted or pruned now)."""
    content_checked: bool = True
    """Whether :func:`verify_cache` can check its bytes, not only their count (an opaque ETag,
    or a multipart one whose part sizes are unknown, gives only the count)."""


def cache_entries(root: str | os.PathLike[str]) -> list[CacheEntry]:
    """The complete shards under ``root``, least recently used first; writes nothing."""
    cache = _existing(root, write=False)
    out = []
    for key, size, used in sorted(cache._complete(), key=lambda e: e[2]):
        try:
            record = _record_of(read_bytes(cache._pin(key))) or {}
        except OSError:
            record = {}
        in_use = is_locked(cache._pin(key))
        checked = ContentCheck(record.get("version", ""), size,
                               record.get("parts")).verifies_content
        out.append(CacheEntry(key, size, used, record.get("display", key), in_use, checked))
    return out


def prune_cache(root: str | os.PathLike[str], max_bytes: int) -> tuple[list[str], int]:
    """Evict least recently used shards until at most ``max_bytes`` remain, never a shard in
    use; (evicted keys, bytes left)."""
    cache = _existing(root, write=True)
    evicted = []
    with FileLock(cache.root / "cache.lock") as ledger:
        complete = sorted(cache._complete(), key=lambda e: e[2])
        used = sum(size for _, size, _ in complete)
        for key, size, _ in complete:
            if used <= max_bytes:
                break
            if cache._evict(key):
                evicted.append(key)
                used -= size
        _ledger_set(ledger, used)
    return evicted, used


def verify_cache(root: str | os.PathLike[str]) -> list[tuple[CacheEntry, str | None]]:
    """Every complete shard re-hashed against its recorded version (and part sizes): (entry,
    problem or None). A shard whose bytes do not match is removed (the next reader downloads
    it again) when the cache is a writable one of this user's; otherwise the problem says why
    it stays. Only that removal writes."""
    cache = _existing(root, write=False)
    results = []
    for entry in cache_entries(root):
        path = cache.shard_path(entry.key)
        try:
            record = _record_of(read_bytes(cache._pin(entry.key)))
        except OSError:
            record = None
        if record is None or "version" not in record:
            results.append((entry, "no verification record (downloaded by an older version, "
                                   "or its download was interrupted)"))
            continue
        if os.lstat(path).st_size != record.get("size") or not ContentCheck.of_file(
                path, record["version"], record["size"], record.get("parts")):
            problem = "its bytes do not match the listed size and hash"
            if not entry.in_use:
                try:
                    writable = _existing(root, write=True)
                    with FileLock(writable.root / "cache.lock") as ledger:
                        if writable._evict(entry.key):
                            _ledger_add(ledger, -entry.size)
                            problem += "; removed"
                except ZephonError as exc:
                    problem += f"; not removed: {exc}"
            results.append((entry, problem))
            continue
        results.append((entry, None))
    return results


def _existing(root: str | os.PathLike[str], write: bool) -> ShardCache:
    """The cache at ``root``, which must exist; ``write``: checked and writable (see
    :class:`ShardCache`), else read-only."""
    if not (Path(root) / "shards").is_dir():
        raise ConfigError(f"{root} is not a Zephon shard cache (no shards/ directory)")
    return ShardCache(CacheOptions(enabled=True, root=str(root)), read_only=not write)


CACHE_HINT = ("StoreOptions(cache=CacheOptions(enabled=True, root='/local/disk/zephon-cache', "
              "limit_bytes=50 << 30))")
"""The options that enable the shard cache, as error messages show them."""


def require_cache(io_options: StoreOptions, name: str, path: str, where: str) -> None:
    """Refuse ``io_options`` without an enabled shard cache for dataset ``name`` (``path``),
    read from ``where`` (the Hub, an object store), which only the cache can read."""
    if not io_options.cache.enabled:
        raise ConfigError(
            f"dataset {name!r} ({path}) is read from {where} through the shard cache, which is "
            "not enabled. Enable it, on fast local disk with a size limit: "
            f"Pipeline(...).options(io_options={CACHE_HINT})")


def bound_cache(cache: ShardCache | None, name: str, path: str) -> ShardCache:
    """``cache``, refused while dataset ``name`` (``path``) has not been bound to one."""
    if cache is None:
        raise ConfigError(f"dataset {name!r} ({path}) must be bound to a shard cache before it "
                          f"is read: pass io_options={CACHE_HINT} to Pipeline.options")
    return cache
