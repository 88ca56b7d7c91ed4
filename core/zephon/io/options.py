"""Storage options: where remote shards are cached and how much disk they may use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zephon.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The node-local shard cache that Hub (``hf://``) data is read through.

    Whole shards are downloaded into ``root`` before they are read. The cache evicts least
    recently used shards to stay within ``limit_bytes`` and never evicts a shard that a reader
    holds open. Put it on fast local disk; all ranks of a node share it safely.
    """

    enabled: bool = False
    """Hub datasets refuse to load unless this is True."""
    root: str | Path | None = None
    """Cache directory. Required when enabled."""
    limit_bytes: int | None = None
    """Upper bound on the bytes of cached shards (None: unbounded)."""

    def __post_init__(self) -> None:
        if self.enabled and self.root is None:
            raise ConfigError("CacheOptions(enabled=True) needs root=<directory on local disk>")
        if self.limit_bytes is not None and self.limit_bytes <= 0:
            raise ConfigError(f"CacheOptions.limit_bytes must be positive, got {self.limit_bytes}")


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """How datasets are read: the shard cache and download behaviour."""

    cache: CacheOptions = field(default_factory=CacheOptions)
    """The shard cache; required (enabled) for Hub datasets."""
    max_retries: int = 8
    """Attempts for a request answered 429 or 5xx before giving up."""
    show_progress: bool = True
    """Log download progress (bytes and time) for each shard."""
