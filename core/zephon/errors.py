"""Exceptions raised by Zephon.

Every error a user can cause names the thing at fault: the option, the file (and line for
JSONL), the field, or the part of a checkpoint that does not match.
"""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of Zephon's own exceptions. Credentials in its text arguments (an endpoint's
    password, a signed URL, a token) are replaced by ``***`` (:func:`zephon.redact.redact`)."""

    def __init__(self, *args: object):
        from zephon.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(ZephonError, ValueError):
    """An option, operator chain or recipe is invalid or contradictory."""


class DataError(ZephonError, ValueError):
    """A data file cannot be read as declared (missing field, malformed line, bad file)."""


class StateMismatchError(ZephonError, ValueError):
    """A checkpointed loader state does not fit the pipeline it is loaded into."""


class WorkerError(ZephonError, RuntimeError):
    """A worker process of ``options(workers=N)`` died; the message names how."""
