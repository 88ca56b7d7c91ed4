"""Zephon's loggers: each module's logger redacts credentials from every record it logs
(:func:`zephon.redact.redact`), its arguments formatted into the message once."""

from __future__ import annotations

import logging

from zephon.redact import redact


class _Redacting(logging.Filter):
    """Formats a record's message once, redacted (its arguments are dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        return True


_FILTER = _Redacting()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with redaction: a logger's filters see only the records
    logged on it, not those of its children, so each module's logger carries it."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
