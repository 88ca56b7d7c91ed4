"""Advisory file locks shared by the processes of one machine (POSIX ``flock``).

A lock is a file; holders take it shared or exclusive, waiting or not. The kernel drops a lock
when its process dies, so a killed process never leaves a lock behind. A lock file may be
deleted by whoever holds it exclusively: a waiter that then obtains the lock on the deleted file
notices (its inode no longer matches the path) and locks the new file instead. ``flock`` is
reliable on local file systems; network file systems may not honour it, so the cache root must
be on local disk.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                self._fd = fd
                return True
            os.close(fd)

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
