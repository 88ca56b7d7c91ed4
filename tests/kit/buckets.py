"""An in-memory object store bucket, registered as a URL scheme plug-in, and the buckets it
holds: object-store tests without a server."""

from __future__ import annotations

import hashlib

from zephon.errors import DataError
from zephon.io.storage import ObjectInfo

BUCKETS: dict[str, dict[str, bytes]] = {}


class MemoryBucket:
    """A bucket held in :data:`BUCKETS`; the version is the MD5 of the content."""

    def __init__(self, bucket: str, io_options, *, latency: float = 0.0):
        self.url = f"mem://{bucket}"
        self.objects = BUCKETS[bucket]
        self.downloads: list[str] = []

    def _version(self, data: bytes) -> str:
        return "md5:" + hashlib.md5(data, usedforsecurity=False).hexdigest()

    def list(self, prefix: str) -> list[ObjectInfo]:
        return [ObjectInfo(k, len(v), self._version(v)) for k, v in self.objects.items()
                if k.startswith(prefix)]

    def _checked(self, info: ObjectInfo) -> bytes:
        data = self.objects[info.key]
        if self._version(data) != info.version:
            raise DataError(f"{self.url}/{info.key} changed")
        return data

    def read_range(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        return self._checked(info)[start:stop]

    def download(self, info, out, display, show_progress) -> None:
        self.downloads.append(info.key)
        out.write(self._checked(info))
