"""Opens of the files of one directory by any process, counted with Linux inotify.

pyarrow opens files from C++, out of the sight of Python's audit hooks, so the kernel counts
them: an inotify watch on the directory reports every open. The watch also takes close
events, so that repeated opens of one file are not merged into one event (the kernel merges
an event identical to the last one still queued); call :meth:`OpenCounter.drain` often
enough that the queue (16,384 events by default) does not overflow, which is an error.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

IN_OPEN, IN_CLOSE_NOWRITE, IN_Q_OVERFLOW = 0x20, 0x10, 0x4000


class OpenCounter:
    """Opens of the files (not sub-directories) of ``folder`` since the counter started."""

    def __init__(self, folder: str | Path):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK)
        if self._fd < 0 or self._libc.inotify_add_watch(
                self._fd, str(folder).encode(), IN_OPEN | IN_CLOSE_NOWRITE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")
        self.opens = 0

    def drain(self) -> int:
        """Read the queued events; returns :attr:`opens`."""
        while True:
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                return self.opens
            offset = 0
            while offset < len(data):
                _, mask, _, length = struct.unpack_from("iIII", data, offset)
                if mask & IN_Q_OVERFLOW:
                    raise RuntimeError("inotify queue overflowed: opens were lost")
                self.opens += bool(mask & IN_OPEN) and length > 0
                offset += 16 + length

    def close(self) -> None:
        os.close(self._fd)
