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

Safety (:mod:`zephon.io.hub.cachefs`): the root and its folders are private to their user
(created with mode 0700; one owned by another user, or writable by group or others, is refused),
nothing inside the root is opened through a symbolic link, fresh files are created exclusively,
and a full, read-only or refused disk gives an error that names the path and what to do.
Eviction and listing skip whatever in ``shards/`` is not a regular file (logged once).
Read-only commands (:func:`cache_entries`, :func:`verify_cache`) create and write nothing, so
they work on a read-only cache.

Limits: a killed download leaves only a ``partial/`` file and a reservation; both are removed by
the next accounting once the dead process's lock is gone, and nothing in ``partial/`` is ever
read. The limit counts shard bytes, not the small state files. Corruption that rewrites a file
changes its stat and is caught; corruption that leaves size, modification time and inode
unchanged (silent disk bit rot) is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.io import cancel
from zephon.io.hub.cachefs import (
    open_fresh,
    open_read,
    private_dir,
    read_bytes,
    replace_file,
    reported,
    write_fresh,
)
from zephon.io.hub.locks import FileLock, is_locked
from zephon.io.store_options import CacheOptions, default_cache_root
from zephon.redact import get_logger

log = get_logger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SPACE_POLL_S = 0.05
_SKIPPED: set[str] = set()


class ContentCheck:
    """Incremental check of a file's bytes against its listed version.

    ``sha256:<hex>`` is the SHA-256 of the content (Hub LFS/Xet files); ``git-sha1:<hex>`` is
    the git blob id, SHA-1 of ``b"blob <size>\\0" + content`` (small files kept in git);
    ``md5:<hex>`` the MD5 of the content (an object store's single-part ETag). Any other
    version checks the size only.
    """

    def __init__(self, version: str, size: int):
        kind, _, self.expected = version.partition(":")
        self.size = size
        self.seen = 0
        if kind == "sha256":
            self._hash: Any = hashlib.sha256()
        elif kind == "md5":
            self._hash = hashlib.md5(usedforsecurity=False)
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
        with os.fdopen(open_read(path), "rb") as fh:
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


Fetch = Callable[[BinaryIO], None]


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
        for sub in ("shards", "partial", "state"):
            private_dir(self.root / sub, "shard cache folder")
        probe = self.root / "state" / f".probe-{os.getpid()}"
        write_fresh(probe, b"", "shard cache root")
        probe.unlink()

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
            pin.touch()
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
            record = json.loads(read_bytes(self._state(item.key, "ok")))
            st = os.lstat(path)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and record == _signature(st, item)

    def _ensure(self, path: Path, item: CachedFile, fetch: Fetch) -> None:
        if self._trusted(path, item):
            self.stats.hits += 1
            return
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if (stat.S_ISREG(st.st_mode) and st.st_size == item.size
                    and ContentCheck.of_file(path, item.version, item.size)):
                self._record(path, item)
                self.stats.hits += 1
                return
            log.warning("shard cache: %s at %s is not a regular file matching its listed "
                        "size/hash; discarding it and downloading it again", item.display, path)
            self.stats.discarded += 1
            with reported("cached shard", path):
                path.unlink(missing_ok=True)
        self._state(item.key, "ok").unlink(missing_ok=True)
        self._reserve(item)
        partial = self.root / "partial" / item.key
        try:
            start = time.monotonic()
            with reported(f"partial download of {item.display} at", partial,
                          lambda: self._space_advice(item)):
                with os.fdopen(open_fresh(partial), "wb") as out:
                    fetch(out)
                    out.flush()
                    os.fsync(out.fileno())
                written = os.lstat(partial).st_size
                if written != item.size:
                    raise DataError(f"{item.display}: download wrote {written} bytes, the "
                                    f"listing says {item.size}")
                os.replace(partial, path)
            self._record(path, item)
            self.stats.downloads += 1
            self.stats.downloaded_bytes += item.size
            self.stats.download_seconds += time.monotonic() - start
        finally:
            partial.unlink(missing_ok=True)
            self._state(item.key, "reserve").unlink(missing_ok=True)

    def _space_advice(self, item: CachedFile) -> str:
        """What to do when ``item`` does not fit on the disk (for :func:`reported`)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = 0
        used = self.used_bytes()
        limit = (f"CacheOptions.limit_bytes={self.limit} is more than the disk holds: lower it "
                 f"below {used + free} bytes" if self.limit is not None else
                 "No CacheOptions.limit_bytes is set: set one below what the disk holds")
        return (f"{item.display} needs {item.size} bytes; {free} bytes are free and {used} bytes "
                f"of shards are cached in shard cache root {self.root}. {limit}, free at least "
                f"{max(item.size - free, 0)} bytes on that disk, or choose another "
                "CacheOptions.root.")

    def _record(self, path: Path, item: CachedFile) -> None:
        target = self._state(item.key, "ok")
        replace_file(target, json.dumps(_signature(os.lstat(path), item)).encode(),
                     "shard cache record")

    # -- space ----------------------------------------------------------------------------
    def _reserve(self, item: CachedFile) -> None:
        deadline = time.monotonic() + self.space_wait_s
        while True:
            with FileLock(self.root / "cache.lock"):
                if self._make_room(item):
                    write_fresh(self._state(item.key, "reserve"), str(item.size).encode(),
                                "shard cache reservation")
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
        """(key, size, last use) of every complete shard; whatever is not a regular file is
        skipped (and logged once per process)."""
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
                try:
                    used = os.lstat(self._state(entry.name, "pin")).st_mtime
                except FileNotFoundError:
                    used = st.st_mtime
                out.append((entry.name, st.st_size, used))
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
                total += int(read_bytes(self._state(key, "reserve")) or 0)
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
    """The complete shards under ``root``, least recently used first; writes nothing."""
    cache = _existing(root, write=False)
    out = []
    for key, size, used in sorted(cache._complete(), key=lambda e: e[2]):
        try:
            record = json.loads(read_bytes(cache._state(key, "ok")))
        except (OSError, ValueError):
            record = {}
        in_use = is_locked(cache._state(key, "pin"))
        out.append(CacheEntry(key, size, used, record.get("display", key), in_use))
    return out


def prune_cache(root: str | os.PathLike[str], max_bytes: int) -> tuple[list[str], int]:
    """Evict least recently used shards until at most ``max_bytes`` remain, never a shard in
    use; (evicted keys, bytes left)."""
    cache = _existing(root, write=True)
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
    None). A shard whose bytes do not match is removed (the next reader downloads it again)
    when the cache is a writable one of this user's; otherwise the problem says why it stays.
    Only that removal writes."""
    cache = _existing(root, write=False)
    results = []
    for entry in cache_entries(root):
        path = cache.shard_path(entry.key)
        try:
            record = json.loads(read_bytes(cache._state(entry.key, "ok")))
        except (OSError, ValueError):
            results.append((entry, "no verification record (downloaded by an older version)"))
            continue
        if os.lstat(path).st_size != record.get("size") or not ContentCheck.of_file(
                path, record["version"], record["size"]):
            problem = "its bytes do not match the listed size and hash"
            if not entry.in_use:
                try:
                    if _existing(root, write=True)._evict(entry.key):
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
