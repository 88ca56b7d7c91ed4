"""Object stores: one storage plug-in a URL scheme (``s3://bucket/prefix/*.parquet``).

A plug-in is a :class:`Scheme`: a factory that opens a bucket as an :class:`ObjectStore` and
the keyword options its paths take. An ``ObjectStore`` does three things, and the rest of
Zephon (listing with globs, format detection, Parquet footers by range, units, the shard
cache, fingerprints, resume) is shared by every scheme in
:class:`zephon.io.storage.object_store_dataset.ObjectStoreDataset`:

- ``list(prefix)``: every object under a key prefix with its size and version (an ETag or
  content hash: what a pinned Hub commit is to ``hf://``);
- ``read_range(info, start, stop)``: bytes of one object (Parquet footers while listing);
- ``download(info, out, display, show_progress)``: the whole object into ``out``, refusing
  an object whose version is no longer ``info.version``;
- optionally ``head(key)``: the one object ``key`` (None when there is none), for a path that
  names one key. A store that lists by whole path segments (the built-in ones) needs it; one
  without it is listed by string prefix, which finds a key and a folder alike.

Adding a scheme is one module and one call::

    register_scheme("mem", Scheme(factory=MemoryBucket, options=()))

after which ``Dataset.from_path("d", "mem://bucket/*.parquet")`` and a recipe's
``path = "mem://..."`` read through it. Built in: ``s3`` (:mod:`zephon.io.storage.s3`, the
``s3`` extra), ``gs`` (:mod:`zephon.io.storage.gs`) and ``az`` (:mod:`zephon.io.storage.az`),
each with the extra of its name. Factories named as
``"module:function"`` are imported on first use, so a scheme's client library loads only when
a path names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from zephon.errors import ConfigError
from zephon.io.storage.object_info import ObjectInfo
from zephon.named_objects import MissingModule, import_named

HUB_SCHEME = "hf"
"""``hf://`` is remote too, but read by :mod:`zephon.io.hub` (a Hub repository, not a
bucket)."""


class ObjectStore(Protocol):
    """One bucket of an object store; see the module docstring."""

    url: str
    """``scheme://bucket``, how errors name the bucket."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in any order (a store may read a
        prefix as a folder: whole path segments)."""
        ...

    def read_range(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object ``info`` lists (at that version)."""
        ...

    def download(self, info: ObjectInfo, out: BinaryIO, display: str,
                 show_progress: bool) -> dict[str, Any] | None:
        """Write the whole object to ``out``; a DataError when it changed since ``info`` or
        its bytes do not match it. May return fields the shard cache keeps to check the copy
        again later (``{"parts": [...]}``)."""
        ...


Factory = Callable[..., ObjectStore]
"""``factory(bucket, io_options, **path_options) -> ObjectStore``; ``io_options`` is the
pipeline's :class:`~zephon.io.store_options.StoreOptions` (retries, timeouts)."""


@dataclass(frozen=True, slots=True)
class Scheme:
    """A storage plug-in; see the module docstring."""

    factory: Factory | str
    """Opens a bucket: a callable, or ``"module:function"`` imported on first use."""
    options: tuple[str, ...] = ()
    """Keyword options of ``Dataset.from_path`` (recipe keys) for this scheme's paths, e.g.
    ``endpoint``; anything else is a ConfigError naming these."""
    extra: str | None = None
    """The pip extra that installs the client (``zephon[s3]``), named when it is missing."""
    description: str = field(default="", compare=False)
    """One line for ``zephon check`` and errors."""

    def open(self, bucket: str, io_options: Any, **options: Any) -> ObjectStore:
        factory = self.factory
        if isinstance(factory, str):
            try:
                factory = import_named(factory, "the bucket opener")
            except MissingModule as exc:
                hint = (f": install it with pip install 'zephon[{self.extra}]'"
                        if self.extra else "")
                raise ConfigError(f"reading this object store needs {exc.module}, which is not "
                                  f"installed{hint}") from None
        return factory(bucket, io_options, **options)


_SCHEMES: dict[str, Scheme] = {
    "s3": Scheme("zephon.io.storage.s3:open_bucket", ("endpoint", "region", "profile"),
                 "s3", "Amazon S3 and S3-compatible stores (MinIO, R2, Ceph)"),
    "gs": Scheme("zephon.io.storage.gs:open_bucket", ("endpoint",), "gs",
                 "Google Cloud Storage"),
    "az": Scheme("zephon.io.storage.az:open_bucket", ("account", "endpoint"), "az",
                 "Azure Blob Storage"),
}


def register_scheme(name: str, scheme: Scheme) -> None:
    """Read ``name://bucket/key`` paths through ``scheme`` (replacing any earlier one)."""
    if not name.isidentifier() or name == HUB_SCHEME or name in ("file",):
        raise ConfigError(f"register_scheme: {name!r} cannot be an object-store scheme")
    if not isinstance(scheme, Scheme):
        raise ConfigError(f"register_scheme: expected a Scheme, got {type(scheme).__name__}")
    _SCHEMES[name] = scheme


def unregister_scheme(name: str) -> None:
    """Forget a scheme :func:`register_scheme` added."""
    _SCHEMES.pop(name, None)


def schemes() -> dict[str, Scheme]:
    """The registered object-store schemes, by name."""
    return dict(_SCHEMES)


def scheme_of(path: str) -> str | None:
    """The ``scheme`` of ``scheme://...``, else None (a local path)."""
    head, sep, _ = str(path).partition("://")
    return head if sep and head.isidentifier() else None


def is_remote(path: str) -> bool:
    """True for ``hf://`` and registered object-store paths: recipes keep them as written
    instead of joining them onto their own folder, and no local file is looked for."""
    scheme = scheme_of(path)
    return scheme == HUB_SCHEME or scheme in _SCHEMES


def get_scheme(name: str) -> Scheme:
    try:
        return _SCHEMES[name]
    except KeyError:
        known = ", ".join(f"{s}://" for s in sorted([HUB_SCHEME, *_SCHEMES]))
        raise ConfigError(f"{name}:// is not a known storage scheme (known: {known}); a new "
                          "one is registered with zephon.io.storage.register_scheme") from None


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, key pattern)`` of ``scheme://bucket/key-or-glob``."""
    scheme = scheme_of(url)
    if scheme is None:
        raise ConfigError(f"{url!r} is not a scheme://bucket/key path")
    bucket, _, key = url.split("://", 1)[1].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r}: no bucket (expected {scheme}://bucket/prefix)")
    return scheme, bucket, key
