"""Advisory file locks shared by the processes of one machine (POSIX ``flock``).

A lock is a file; holders take it shared or exclusive, waiting or not. The kernel drops a lock
when its process dies, so a killed process never leaves a lock behind. A lock file may be
deleted by whoever holds it exclusively: a waiter that then obtains the lock on the deleted file
notices (its inode no longer matches the path) and locks the new file instead. ``flock`` is
reliable on local file systems; network file systems may not honour it, so the cache root must
be on local disk. Lock files are opened with ``O_NOFOLLOW`` and created with mode 0600: a lock
file that is a symbolic link is refused (:class:`~zephon.errors.ConfigError`), never followed,
and a failed create is reported as :func:`zephon.io.cache.private_files.reported` says.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from zephon.io.cache.private_files import FILE_MODE, open_read, reported


class FileLock:
    """``with FileLock(path):`` waits for an exclusive lock; see :meth:`acquire` for the rest."""

    def __init__(self, path: str | os.PathLike[str], shared: bool = False):
        self.path = Path(path)
        self.shared = shared
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; without ``blocking``, return False at once when it is taken."""
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held by this object")
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        if not blocking:
            mode |= fcntl.LOCK_NB
        while True:
            with reported("lock file", self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             FILE_MODE)
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            try:
                current = os.lstat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                self._fd = fd
                return True
            os.close(fd)

    def touch(self) -> None:
        """Set the lock file's modification time to now (through the open file, not the
        path)."""
        if self._fd is None:
            raise RuntimeError(f"lock {self.path} is not held")
        os.utime(self._fd)

    def read(self) -> bytes:
        """The lock file's content (a small record kept in it), read through the open file."""
        if self._fd is None:
            raise RuntimeError(f"lock {self.path} is not held")
        size = os.fstat(self._fd).st_size
        return os.pread(self._fd, size, 0) if size else b""

    def write(self, data: bytes, what: str) -> None:
        """Replace the lock file's content with ``data``, in place through the open file (a
        rename would leave the holders on the old file). A reader may see it half written:
        records kept here are checked when read. A full disk is reported as
        :func:`zephon.io.cache.private_files.reported` says, naming ``what``."""
        if self._fd is None:
            raise RuntimeError(f"lock {self.path} is not held")
        with reported(what, self.path):
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def delete(self) -> None:
        """Remove the lock file (only while holding it exclusively), then release."""
        if self._fd is None or self.shared:
            raise RuntimeError("only an exclusive holder may delete a lock file")
        self.path.unlink(missing_ok=True)
        self.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds a lock on ``path`` (shared or exclusive), found without
    creating or writing anything, so it works on a read-only cache. A missing file, or a link
    (never followed), is not locked."""
    try:
        fd = open_read(Path(path))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
