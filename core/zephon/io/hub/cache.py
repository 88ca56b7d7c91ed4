"""The shard cache: whole remote files, downloaded once per node, kept within a size limit.

Layout under ``root``::

    shards/<key>          complete, verified files: the only files ever handed to readers
    partial/<key>         downloads in progress, renamed into shards/ once complete and verified
    state/<key>.pin       readers hold a shared lock on it while they use the shard; its
                          modification time is the shard's last use
    state/<key>.lock      held by the process that downloads or re-checks the shard
    state/<key>.reserve   bytes promised to a download in progress
    state/<key>.ok        size, modification time and inode of the shard when last verified
    cache.lock            serializes space accounting and eviction

A key is a prefix of the file's content hash plus its name, so identical content is stored
once. "Shared by a node" means: every process of one machine that uses the same ``root`` on a
local file system (locks are ``flock``, see :mod:`zephon.io.hub.locks`).

Opening a file:

1. Pin it (shared lock on its pin file, taken before anything else, so a shard about to be read
   cannot be evicted) and record the time of use.
2. A shard whose stat matches its ``.ok`` record is used as it is.
3. Otherwise take the shard's lock; processes wanting the same shard wait here, so it is
   downloaded once. A shard that exists but whose stat changed is hashed again; one whose size
   or hash does not match the listing is discarded.
4. Make room under ``cache.lock``: the bytes of complete shards plus live reservations must stay
   within ``limit_bytes``. Least recently used shards are evicted first, skipping any that a
   reader has pinned. When only pinned shards are left, wait for readers to finish (up to
   ``space_wait_s``), then fail.
5. Reserve the bytes, download into ``partial/``, fsync, check size and content hash, rename
   into ``shards/`` (atomic), record ``.ok``, drop the reservation.

Limits: a killed download leaves only a ``partial/`` file and a reservation; both are removed by
the next accounting once the dead process's lock is gone, and nothing in ``partial/`` is ever
read. The limit counts shard bytes, not the small state files. Corruption that rewrites a file
changes its stat and is caught; corruption that leaves size, modification time and inode
unchanged (silent disk bit rot) is not.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from zephon.errors import ConfigError, DataError
from zephon.io import cancel
from zephon.io.hub.locks import FileLock
from zephon.io.options import CacheOptions
from zephon.redact import get_logger

log = get_logger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
_SPACE_POLL_S = 0.05


class ContentCheck:
    """Incremental check of a file's bytes against its listed version.

    ``sha256:<hex>`` is the SHA-256 of the content (Hub LFS/Xet files); ``git-sha1:<hex>`` is
    the git blob id, SHA-1 of ``b"blob <size>\\0" + content`` (small files kept in git). Any
    other version checks the size only.
    """

    def __init__(self, version: str, size: int):
        kind, _, self.expected = version.partition(":")
        self.size = size
        self.seen = 0
        if kind == "sha256":
            self._hash: Any = hashlib.sha256()
        elif kind == "git-sha1":
            self._hash = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
        else:
            self._hash = None

    def update(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self._hash is not None:
            self._hash.update(chunk)

    def ok(self) -> bool:
        if self.seen != self.size:
            return False
        return self._hash is None or self._hash.hexdigest() == self.expected

    @classmethod
    def of_file(cls, path: Path, version: str, size: int) -> bool:
        check = cls(version, size)
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                check.update(chunk)
        return check.ok()


@dataclass(frozen=True, slots=True)
class CachedFile:
    """What the cache needs to know about a remote file."""

    name: str
    """File name (kept as the suffix of the key, for readability and format detection)."""
    size: int
    """Size in bytes, from the listing."""
    version: str
    """Content hash, see :class:`ContentCheck`."""
    display: str
    """How errors and logs name the file."""

    @property
    def key(self) -> str:
        digest = self.version.partition(":")[2] or hashlib.sha256(
            self.version.encode()).hexdigest()
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


Fetch = Callable[[BinaryIO], None]


class ShardCache:
    """A size-limited, node-shared cache of whole files; see the module docstring."""

    def __init__(self, options: CacheOptions):
        if not options.enabled or options.root is None:
            raise ConfigError("ShardCache needs CacheOptions(enabled=True, root=...)")
        self.root = Path(options.root).expanduser()
        self.limit = options.limit_bytes
        self.space_wait_s = options.space_wait_s
        self.stats = CacheStats()
        try:
            for sub in ("shards", "partial", "state"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            probe = self.root / "state" / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"shard cache root {self.root} cannot be written ({exc.strerror}); set "
                "CacheOptions.root to a writable directory on local disk") from None

    # -- paths ----------------------------------------------------------------------------
    def shard_path(self, key: str) -> Path:
        return self.root / "shards" / key

    def _state(self, key: str, kind: str) -> Path:
        return self.root / "state" / f"{key}.{kind}"

    def used_bytes(self) -> int:
        """Bytes of complete shards now in the cache."""
        return sum(size for _, size, _ in self._complete())

    # -- opening --------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, item: CachedFile, fetch: Fetch) -> Iterator[str]:
        """A local path to ``item``, downloaded by ``fetch(out)`` if needed; the shard stays
        pinned (never evicted) until the ``with`` block ends."""
        if self.limit is not None and item.size > self.limit:
            raise ConfigError(
                f"{item.display} is {item.size} bytes, more than the shard cache's "
                f"limit_bytes={self.limit}; raise CacheOptions.limit_bytes")
        key = item.key
        pin = FileLock(self._state(key, "pin"), shared=True)
        pin.acquire()
        try:
            os.utime(pin.path)
            path = self.shard_path(key)
            if self._trusted(path, item):
                self.stats.hits += 1
            else:
                with FileLock(self._state(key, "lock")):
                    self._ensure(path, item, fetch)
            yield str(path)
        finally:
            pin.release()

    def _trusted(self, path: Path, item: CachedFile) -> bool:
        try:
            record = json.loads(self._state(item.key, "ok").read_text())
            st = path.stat()
        except (OSError, ValueError):
            return False
        return record == _signature(st, item)

    def _ensure(self, path: Path, item: CachedFile, fetch: Fetch) -> None:
        if self._trusted(path, item):
            self.stats.hits += 1
            return
        if path.exists():
            if path.stat().st_size == item.size and ContentCheck.of_file(path, item.version,
                                                                         item.size):
                self._record(path, item)
                self.stats.hits += 1
                return
            log.warning("shard cache: %s at %s does not match its listed size/hash; "
                        "discarding it and downloading it again", item.display, path)
            self.stats.discarded += 1
            path.unlink(missing_ok=True)
        self._state(item.key, "ok").unlink(missing_ok=True)
        self._reserve(item)
        partial = self.root / "partial" / item.key
        try:
            start = time.monotonic()
            try:
                with open(partial, "wb") as out:
                    fetch(out)
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as exc:
                if exc.errno not in _NO_SPACE and exc.errno not in _READ_ONLY:
                    raise
                raise self._write_failure(item, exc) from None
            if partial.stat().st_size != item.size:
                raise DataError(f"{item.display}: download wrote {partial.stat().st_size} "
                                f"bytes, the listing says {item.size}")
            os.replace(partial, path)
            self._record(path, item)
            self.stats.downloads += 1
            self.stats.downloaded_bytes += item.size
            self.stats.download_seconds += time.monotonic() - start
        finally:
            partial.unlink(missing_ok=True)
            self._state(item.key, "reserve").unlink(missing_ok=True)

    def _write_failure(self, item: CachedFile, exc: OSError) -> DataError:
        if exc.errno in _READ_ONLY:
            return DataError(f"shard cache root {self.root} cannot be written "
                             f"({exc.strerror}) while downloading {item.display}; set "
                             "CacheOptions.root to a writable directory on local disk")
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = 0
        limit = (f"limit_bytes={self.limit} is more than the disk holds: lower it below "
                 f"{self.used_bytes() + free} bytes" if self.limit is not None else
                 "no limit_bytes is set: set one below what the disk holds")
        return DataError(
            f"shard cache root {self.root}: the disk is full ({exc.strerror}) while downloading "
            f"{item.display} ({item.size} bytes; {free} bytes free, {self.used_bytes()} bytes "
            f"of shards cached). {limit}, or free at least {max(item.size - free, 0)} bytes "
            "on that disk.")

    def _record(self, path: Path, item: CachedFile) -> None:
        target = self._state(item.key, "ok")
        tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_signature(path.stat(), item)))
        os.replace(tmp, target)

    # -- space ----------------------------------------------------------------------------
    def _reserve(self, item: CachedFile) -> None:
        deadline = time.monotonic() + self.space_wait_s
        while True:
            with FileLock(self.root / "cache.lock"):
                if self._make_room(item):
                    self._state(item.key, "reserve").write_text(str(item.size))
                    return
            if time.monotonic() >= deadline:
                raise DataError(
                    f"shard cache {self.root} is full: {item.display} ({item.size} bytes) does "
                    f"not fit in limit_bytes={self.limit} while the other cached shards are "
                    f"being read; waited {self.space_wait_s:.0f} s. Raise "
                    "CacheOptions.limit_bytes (it must hold every shard read at the same time "
                    "on this node).")
            cancel.sleep(_SPACE_POLL_S)

    def _make_room(self, item: CachedFile) -> bool:
        """Evict until ``item`` fits; True when it does. Runs under cache.lock."""
        reserved = self._live_reservations(exclude=item.key)
        complete = self._complete()
        if self.limit is None:
            return True
        used = reserved + sum(size for _, size, _ in complete)
        for key, size, _ in sorted(complete, key=lambda entry: entry[2]):
            if used + item.size <= self.limit:
                break
            if key != item.key and self._evict(key):
                used -= size
        return used + item.size <= self.limit

    def _complete(self) -> list[tuple[str, int, float]]:
        """(key, size, last use) of every complete shard."""
        out = []
        with os.scandir(self.root / "shards") as entries:
            for entry in entries:
                try:
                    size = entry.stat().st_size
                except FileNotFoundError:
                    continue
                try:
                    used = self._state(entry.name, "pin").stat().st_mtime
                except FileNotFoundError:
                    used = entry.stat().st_mtime
                out.append((entry.name, size, used))
        return out

    def _live_reservations(self, exclude: str) -> int:
        """Bytes reserved by downloads in progress; drops those of dead processes."""
        total = 0
        with os.scandir(self.root / "state") as entries:
            names = [e.name for e in entries if e.name.endswith(".reserve")]
        for name in names:
            key = name[: -len(".reserve")]
            if key == exclude:
                continue
            lock = FileLock(self._state(key, "lock"))
            if lock.acquire(blocking=False):
                try:
                    (self.root / "partial" / key).unlink(missing_ok=True)
                    self._state(key, "reserve").unlink(missing_ok=True)
                    log.info("shard cache: removed the leftovers of an interrupted download "
                             "of %s", key)
                finally:
                    lock.release()
                continue
            try:
                total += int(self._state(key, "reserve").read_text() or 0)
            except (OSError, ValueError):
                continue
        return total

    def _evict(self, key: str) -> bool:
        pin = FileLock(self._state(key, "pin"))
        if not pin.acquire(blocking=False):
            return False
        lock = FileLock(self._state(key, "lock"))
        if not lock.acquire(blocking=False):
            pin.release()
            return False
        try:
            self.shard_path(key).unlink(missing_ok=True)
            self._state(key, "ok").unlink(missing_ok=True)
            self.stats.evictions += 1
            log.debug("shard cache: evicted %s", key)
        finally:
            lock.delete()
            pin.delete()
        return True


def _signature(st: os.stat_result, item: CachedFile) -> dict[str, Any]:
    return {"version": item.version, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ino": st.st_ino, "display": item.display}


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


def cache_entries(root: str | os.PathLike[str]) -> list[CacheEntry]:
    """The complete shards under ``root``, least recently used first."""
    cache = _existing(root)
    out = []
    for key, size, used in sorted(cache._complete(), key=lambda e: e[2]):
        try:
            record = json.loads(cache._state(key, "ok").read_text())
        except (OSError, ValueError):
            record = {}
        pin = FileLock(cache._state(key, "pin"))
        in_use = not pin.acquire(blocking=False)
        if not in_use:
            pin.release()
        out.append(CacheEntry(key, size, used, record.get("display", key), in_use))
    return out


def prune_cache(root: str | os.PathLike[str], max_bytes: int) -> tuple[list[str], int]:
    """Evict least recently used shards until at most ``max_bytes`` remain, never a shard in
    use; (evicted keys, bytes left)."""
    cache = _existing(root)
    evicted = []
    with FileLock(cache.root / "cache.lock"):
        complete = sorted(cache._complete(), key=lambda e: e[2])
        used = sum(size for _, size, _ in complete)
        for key, size, _ in complete:
            if used <= max_bytes:
                break
            if cache._evict(key):
                evicted.append(key)
                used -= size
    return evicted, used


def verify_cache(root: str | os.PathLike[str]) -> list[tuple[CacheEntry, str | None]]:
    """Every complete shard re-hashed against its recorded version: (entry, problem or
    None). A shard whose bytes do not match is removed (the next reader downloads it again)."""
    cache = _existing(root)
    results = []
    for entry in cache_entries(root):
        path = cache.shard_path(entry.key)
        try:
            record = json.loads(cache._state(entry.key, "ok").read_text())
        except (OSError, ValueError):
            results.append((entry, "no verification record (downloaded by an older version)"))
            continue
        if path.stat().st_size != record.get("size") or not ContentCheck.of_file(
                path, record["version"], record["size"]):
            problem = "its bytes do not match the listed size and hash"
            if not entry.in_use and cache._evict(entry.key):
                problem += "; removed"
            results.append((entry, problem))
            continue
        results.append((entry, None))
    return results


def _existing(root: str | os.PathLike[str]) -> ShardCache:
    if not (Path(root) / "shards").is_dir():
        raise ConfigError(f"{root} is not a Zephon shard cache (no shards/ directory)")
    return ShardCache(CacheOptions(enabled=True, root=str(root)))
