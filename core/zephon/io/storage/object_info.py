"""One object of a bucket listing: :class:`ObjectInfo`, what every store client returns.
Its own module so that the clients (imported by the scheme registry in
:mod:`zephon.io.storage` when a scheme is first used) need not import the registry back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a listing."""

    key: str
    """Its key in the bucket (no leading ``/``)."""
    size: int
    """Bytes."""
    version: str
    """What identifies its content: ``md5:<hex>`` where the store gives the MD5 (a
    single-part S3 ETag; checked on download), else ``etag:<etag>`` (a multipart ETag,
    recomputed where the store gives the part sizes, or a version id: compared, not
    recomputed)."""
    problem: str | None = None
    """Why the object cannot be read, for a listed key the client cannot request (the listing
    skips it and reports it with this reason); None for every readable object."""
