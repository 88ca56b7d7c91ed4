"""The adapter's error type, below every other module so that all of them can raise it."""

from __future__ import annotations

from zephon.errors import ConfigError


class ZephonArgumentError(ConfigError):
    """A flag, a recipe or their combination cannot run; the message names which."""
