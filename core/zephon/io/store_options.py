"""Storage options: where remote shards are cached and how much disk they may use."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from zephon.errors import ConfigError

CACHE_DIR_NAME = "zephon/shard-cache"
LIMIT_NAMES = "[cache] limit_bytes in a recipe, CacheOptions.limit_bytes in Python"
LIMIT_OPTION = f"limit_bytes ({LIMIT_NAMES})"
"""How errors name the cache's size limit, for recipe and Python users alike."""
ROOT_OPTION = "root ([cache] root in a recipe, CacheOptions.root in Python)"
"""How errors name the cache's folder."""


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/zephon/shard-cache`` when ``XDG_CACHE_HOME`` is an absolute path, else
    ``~/.cache/zephon/shard-cache``: a folder of the user's own, never a shared one."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / CACHE_DIR_NAME
    try:
        home = Path.home()
    except (KeyError, RuntimeError):
        raise ConfigError("the default shard cache root needs a home directory (HOME), or "
                          "XDG_CACHE_HOME; none is set: set CacheOptions.root") from None
    return home / ".cache" / CACHE_DIR_NAME


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The node-local shard cache that Hub (``hf://``) data is read through.

    Whole shards are downloaded into ``root`` before they are read. The cache evicts least
    recently used shards to stay within ``limit_bytes`` and never evicts a shard that a reader
    holds open. Put it on fast local disk; all ranks of a node share it safely (they run as one
    user: the cache is private to its user, see :mod:`zephon.io.cache.private_files`).
    """

    enabled: bool = False
    """Hub datasets refuse to load unless this is True."""
    root: str | Path | None = None
    """Cache directory. None: ``$XDG_CACHE_HOME/zephon/shard-cache``, else
    ``~/.cache/zephon/shard-cache`` (:func:`default_cache_root`). Zephon creates it with mode
    0700 and refuses one that belongs to another user or that group or others may write. Where
    home folders are on a network file system or under a small quota, point it at local disk of
    your own (for example ``/local/scratch/$USER/zephon``): locks need a local file system."""
    limit_bytes: int | None = None
    """Upper bound on the bytes of cached shards (None: unbounded)."""
    space_wait_s: float = 600.0
    """How long a download waits for readers to release shards when the cache is full of shards
    being read, before it fails with an error that asks for a larger ``limit_bytes``."""

    def __post_init__(self) -> None:
        if self.limit_bytes is not None and self.limit_bytes <= 0:
            raise ConfigError(f"CacheOptions.limit_bytes must be positive, got {self.limit_bytes}")
        if self.space_wait_s < 0:
            raise ConfigError(f"CacheOptions.space_wait_s must be >= 0, got {self.space_wait_s}")


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """How datasets are read: the shard cache and download behaviour."""

    cache: CacheOptions = field(default_factory=CacheOptions)
    """The shard cache; required (enabled) for Hub datasets."""
    max_retries: int = 8
    """Retries of a request answered 429 or 5xx (or dropped) before giving up."""
    retry_base_wait_s: float = 1.0
    """Backoff before the first retry; it doubles with each retry. A ``Retry-After`` answer
    header overrides it."""
    retry_max_wait_s: float = 60.0
    """Cap on every wait between retries, a server's ``Retry-After`` included; one request
    waits at most ``max_retries * retry_max_wait_s`` in all."""
    timeout_s: float = 60.0
    """Seconds to wait for a connection or for the next bytes of an answer."""
    show_progress: bool = True
    """Log download progress (bytes and time) for each shard."""
    resume_on_checkpoint_commit: bool = True
    """When a checkpoint was written on a Hub branch that has moved since, resume on the
    checkpoint's commit (and log it) instead of refusing the checkpoint. Paths that name a
    commit never move."""

    def __post_init__(self) -> None:
        if not isinstance(self.cache, CacheOptions):
            raise ConfigError("StoreOptions.cache must be a CacheOptions")
        if self.max_retries < 0:
            raise ConfigError(f"StoreOptions.max_retries must be >= 0, got {self.max_retries}")
        for name in ("retry_base_wait_s", "retry_max_wait_s", "timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"StoreOptions.{name} must be >= 0, got "
                                  f"{getattr(self, name)}")
