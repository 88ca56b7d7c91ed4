"""Retrying requests to remote stores: one loop, one backoff and one way of sorting failures,
for the object stores (:mod:`zephon.io.storage.obstore_bucket`) and the Hub
(:mod:`zephon.io.hub.client`).

A client sorts each failure (its ``classify``) into one of three kinds:

- **transient**: answers 408, 429, 500, 502, 503 and 504, connections dropped, reset or timed
  out, a transfer that ended early or whose bytes do not match. Retried up to
  ``max_retries`` times; the wait before retry ``n`` (from 0) is
  ``min(max_wait_s, base_wait_s * 2**n)`` scaled by a random factor in [0.5, 1], so that the
  ranks of a job do not retry in step, or the server's ``Retry-After`` capped at
  ``max_wait_s`` (a server asking for an hour does not stall a job for hours). One request
  waits at most ``max_retries * max_wait_s`` in all, plus its own timeouts.
- **unreachable**: the endpoint refused the connection, or its host name does not resolve.
  That is a mistyped endpoint or a store that is not there, not an outage that backoff
  outlasts: it is retried :data:`UNREACHABLE_RETRIES` times at most, each wait capped at
  :data:`UNREACHABLE_WAIT_S` (enough for a server restarting in place), so the error, which
  the client words with the endpoint and the credential source, comes within seconds. A host
  that does not answer at all (packets dropped) ends in a connect timeout: transient.
- anything else (denied, missing, refused as invalid): raised at once, for the client to
  explain.

Waits go through :func:`zephon.io.cancel.sleep` (Ctrl-C stops one within 0.1 s) and every
retry is logged with its reason.
"""

from __future__ import annotations

import errno
import random
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from zephon.io import cancel
from zephon.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP answers that are worth asking again."""
UNREACHABLE_RETRIES = 2
"""Retries of a refused connection or an unresolved host name, at most."""
UNREACHABLE_WAIT_S = 1.0
"""Cap on each wait before such a retry."""

TRANSIENT = "transient"
UNREACHABLE = "unreachable"

_STATUS = re.compile(r"\bstatus(?: code)?:? \(?(\d{3})\b", re.IGNORECASE)
_REFUSED = ("connection refused", "connectionrefused")
_UNRESOLVED = ("dns error", "failed to lookup address", "name or service not known",
               "nodename nor servname", "temporary failure in name resolution",
               "no address associated with hostname", "name resolution")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry; see the module docstring."""

    max_retries: int = 8
    """Retries after the first attempt."""
    base_wait_s: float = 1.0
    """Wait before the first retry; doubles with each retry."""
    max_wait_s: float = 60.0
    """Cap on every wait, Retry-After included."""

    @classmethod
    def of(cls, options: Any) -> RetryPolicy:
        """The policy a :class:`~zephon.io.store_options.StoreOptions` sets."""
        return cls(options.max_retries, options.retry_base_wait_s, options.retry_max_wait_s)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure worth retrying, as a client's ``classify`` sorts it."""

    kind: str
    """:data:`TRANSIENT` or :data:`UNREACHABLE`."""
    reason: str
    """Short words for logs and errors: ``HTTP 503``, ``connection refused``."""
    retry_after: float | None = None
    """Seconds the server asked to wait (``Retry-After``), if it did."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed request: its response's (httpx, requests) or its own
    ``status``, else the one its message states (obstore), else None."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", getattr(exc, "status", None))
    if isinstance(status, int):
        return status
    match = _STATUS.search(str(exc))
    return int(match.group(1)) if match else None


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds of a ``Retry-After: <seconds>`` header on the failed response, else None."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def unreachable_reason(exc: BaseException) -> str | None:
    """``connection refused`` or ``host name not resolved`` when ``exc`` (or an exception it
    was raised from) says so, else None: the cause of a connection never made."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or getattr(
                current, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(current, socket.gaierror):
            return "host name not resolved"
        text = str(current).lower()
        if any(word in text for word in _REFUSED):
            return "connection refused"
        if any(word in text for word in _UNRESOLVED):
            return "host name not resolved"
        current = current.__cause__ or current.__context__
    return None


def wait_before(attempt: int, failure: Failure, policy: RetryPolicy) -> float:
    """Seconds to wait before retry ``attempt`` (from 0) of ``failure``."""
    if failure.kind == UNREACHABLE:
        cap = min(policy.max_wait_s, UNREACHABLE_WAIT_S)
    else:
        cap = policy.max_wait_s
        if failure.retry_after is not None:
            return min(failure.retry_after, cap)
    return min(cap, policy.base_wait_s * 2 ** attempt) * random.uniform(0.5, 1.0)


def retries_for(failure: Failure, policy: RetryPolicy) -> int:
    """How many retries ``failure`` gets in all."""
    if failure.kind == UNREACHABLE:
        return min(policy.max_retries, UNREACHABLE_RETRIES)
    return policy.max_retries


class GaveUp(Exception):
    """The retries of a request ran out (raised by :func:`retry_call` with the last error as
    its ``__cause__``); clients turn it into an error of theirs."""

    def __init__(self, what: str, failure: Failure, retries: int, last: BaseException):
        super().__init__(f"{what}: {failure.reason}, {retries} retries")
        self.what = what
        self.failure = failure
        self.retries = retries
        self.last = last


def retry_call(fn: Callable[[], T], what: str, policy: RetryPolicy,
               classify: Callable[[Exception], Failure | None]) -> T:
    """``fn()``, retried while ``classify`` sorts its failure as worth retrying (see the module
    docstring). An exception ``classify`` returns None for propagates at once; when the
    retries of a kind of failure run out (each kind counts its own; all together stay within
    ``max_retries``), :class:`GaveUp` is raised from the last exception. ``what`` names the
    request in logs."""
    done = {TRANSIENT: 0, UNREACHABLE: 0}
    while True:
        try:
            return fn()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            attempt, allowed = done[failure.kind], retries_for(failure, policy)
            if attempt >= allowed or sum(done.values()) >= policy.max_retries:
                raise GaveUp(what, failure, sum(done.values()), exc) from exc
            wait = wait_before(attempt, failure, policy)
            log.warning("%s: %s; retry %d of %d in %.2f s", what, failure.reason, attempt + 1,
                        allowed, wait)
            cancel.sleep(wait)
            done[failure.kind] += 1
