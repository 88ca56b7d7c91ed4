"""Checking a remote file's bytes against the version its listing gave, as they arrive or
later from the cached copy.

Versions (:attr:`zephon.io.storage.ObjectInfo.version`, Hub listings):

- ``sha256:<hex>``: the SHA-256 of the content (Hub LFS and Xet files);
- ``git-sha1:<hex>``: the git blob id, SHA-1 of ``b"blob <size>\\0" + content`` (small files
  kept in git);
- ``md5:<hex>``: the MD5 of the content (an object store's single-part ETag);
- ``etag:<hex>-<N>`` with the sizes of its ``N`` parts: an S3 multipart upload's ETag, the MD5
  of the concatenated MD5s of its parts followed by ``-N``. Without the part sizes it cannot be
  recomputed (the boundaries are part of the hash), and only the size is checked;
- anything else (an opaque ETag, a version id): the size only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from typing import Any

MULTIPART_ETAG = re.compile(r"([0-9a-f]{32})-(\d+)")
"""An S3 multipart ETag: the MD5 of the parts' MD5s, then the number of parts."""


def multipart_count(version: str) -> int | None:
    """The number of parts of an ``etag:<hex>-<N>`` version, else None."""
    kind, _, value = version.partition(":")
    match = MULTIPART_ETAG.fullmatch(value) if kind == "etag" else None
    return int(match.group(2)) if match else None


class ContentCheck:
    """Incremental check of a file's bytes against its listed version (see the module
    docstring); ``parts`` are the part sizes of a multipart ETag, when known."""

    def __init__(self, version: str, size: int, parts: Sequence[int] | None = None):
        kind, _, self.expected = version.partition(":")
        self.size = size
        self.seen = 0
        self._parts: list[int] | None = None
        if kind == "sha256":
            self._hash: Any = hashlib.sha256()
        elif kind == "md5":
            self._hash = hashlib.md5(usedforsecurity=False)
        elif kind == "git-sha1":
            self._hash = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
        else:
            self._hash = None
            count = multipart_count(version)
            if count is not None and parts is not None and len(parts) == count and sum(
                    parts) == size and all(p > 0 for p in parts):
                self._parts = list(parts)
                self._digests: list[bytes] = []
                self._part = hashlib.md5(usedforsecurity=False)
                self._left = self._parts[0]

    @property
    def verifies_content(self) -> bool:
        """Whether the bytes are checked, not only their count."""
        return self._hash is not None or self._parts is not None

    def update(self, chunk: bytes | memoryview) -> None:
        self.seen += len(chunk)
        if self._hash is not None:
            self._hash.update(chunk)
        elif self._parts is not None:
            view = memoryview(chunk)
            while len(view):
                if self._left == 0:  # more bytes than the parts hold: caught by the size
                    return
                take = min(self._left, len(view))
                self._part.update(view[:take])
                view = view[take:]
                self._left -= take
                if self._left == 0:
                    self._digests.append(self._part.digest())
                    if len(self._digests) < len(self._parts):
                        self._part = hashlib.md5(usedforsecurity=False)
                        self._left = self._parts[len(self._digests)]

    def ok(self) -> bool:
        if self.seen != self.size:
            return False
        if self._hash is not None:
            return self._hash.hexdigest() == self.expected
        if self._parts is not None:
            combined = hashlib.md5(b"".join(self._digests), usedforsecurity=False).hexdigest()
            return f"{combined}-{len(self._parts)}" == self.expected
        return True

    @classmethod
    def of_file(cls, path: str | os.PathLike[str], version: str, size: int,
                parts: Sequence[int] | None = None) -> bool:
        """Whether the file at ``path`` (never opened through a link) matches."""
        from zephon.io.cache.private_files import open_read

        check = cls(version, size, parts)
        with os.fdopen(open_read(path), "rb") as fh:  # type: ignore[arg-type]
            while chunk := fh.read(1 << 22):
                check.update(chunk)
        return check.ok()
