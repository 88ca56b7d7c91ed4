"""Retrying Hub requests, and turning Hub errors into errors that say what to do.

Retried: answers 408, 429, 500, 502, 503 and 504, dropped or timed-out connections, and a
download whose bytes do not match the listing. The wait before retry ``n`` (from 0) is
``min(max_wait_s, base_wait_s * 2**n)`` scaled by a random factor in [0.5, 1] so that the ranks
of a job do not retry in step; when the answer carries ``Retry-After: <seconds>`` the wait is
that, capped at ``max_wait_s`` too (a server asking for an hour does not stall a job for
hours). After ``max_retries`` retries the last error is raised, so one request waits at most
``max_retries * max_wait_s`` in all (8 minutes with the defaults) plus its own timeouts.

Not retried: 401, 403, 404 and other 4xx answers. They become a ConfigError or DataError that
names what was asked for (dataset, revision, file) and, for gated or private datasets, how to
log in.

This is the only retry loop around these requests: huggingface_hub's ``HfApi.dataset_info``,
``list_repo_refs`` and the first page of ``list_repo_tree`` do not retry, and downloads go
through its HTTP session directly. Later pages of a long tree listing are fetched by
huggingface_hub's own ``http_backoff``; a page that still fails is retried here with the
whole listing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.io import cancel
from zephon.redact import get_logger

log = get_logger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
T = TypeVar("T")


class TransferError(Exception):
    """A download ended early or its bytes do not match the listing (retried)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry; see the module docstring."""

    max_retries: int = 8
    """Retries after the first attempt."""
    base_wait_s: float = 1.0
    """Wait before the first retry; doubles with each retry."""
    max_wait_s: float = 60.0
    """Cap on every wait, Retry-After included."""


def status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def retry_call(fn: Callable[[], T], what: str, policy: RetryPolicy) -> T:
    """``fn()``, retried as the module docstring says; ``what`` names the request in logs."""
    attempt = 0
    while True:
        try:
            return fn()
        except (HfHubHTTPError, httpx.TransportError, TransferError) as exc:
            status = status_of(exc)
            retryable = (status in RETRY_STATUS if isinstance(exc, HfHubHTTPError)
                         else True)
            if not retryable or attempt >= policy.max_retries:
                raise
            asked = _retry_after(exc)
            if asked is None:
                wait = min(policy.max_wait_s, policy.base_wait_s * 2 ** attempt)
                wait *= random.uniform(0.5, 1.0)
            else:
                wait = min(asked, policy.max_wait_s)
            reason = f"HTTP {status}" if status is not None else type(exc).__name__
            log.warning("%s: %s; retry %d of %d in %.2f s", what, reason, attempt + 1,
                        policy.max_retries, wait)
            cancel.sleep(wait)
            attempt += 1


LOGIN = "log in with `hf auth login` or set the HF_TOKEN environment variable"
"""How a user gives huggingface_hub a token, for error messages."""


def explain(exc: BaseException, what: str, repo_id: str, endpoint: str,
            has_token: bool) -> ZephonError:
    """A user-facing error for a failed Hub request about ``what`` in dataset ``repo_id``."""
    page = f"{endpoint}/datasets/{repo_id}"
    if isinstance(exc, GatedRepoError):
        if has_token:
            return DataError(f"{what}: {repo_id} is a gated dataset and your Hugging Face token "
                             f"has no access to it. Accept its conditions at {page} with the "
                             "account of that token, then retry.")
        return DataError(f"{what}: {repo_id} is a gated dataset and no Hugging Face token was "
                         f"found. Accept its conditions at {page}, then {LOGIN}.")
    if isinstance(exc, RepositoryNotFoundError):
        hint = (", or your Hugging Face token cannot read it" if has_token else
                f", or it is private or gated and no Hugging Face token was found ({LOGIN})")
        return DataError(f"{what}: dataset {repo_id} was not found on {endpoint}{hint}.")
    if isinstance(exc, RevisionNotFoundError):
        return ConfigError(f"{what}: the revision does not exist in dataset {repo_id}.")
    if isinstance(exc, EntryNotFoundError):
        return DataError(f"{what}: the file does not exist in dataset {repo_id}.")
    status = status_of(exc)
    if status in (401, 403):
        hint = ("your Hugging Face token lacks permission for it" if has_token else
                f"no Hugging Face token was found ({LOGIN})")
        return DataError(f"{what}: access denied by {endpoint} (HTTP {status}): {hint}.")
    if status is not None:
        return DataError(f"{what}: {endpoint} answered HTTP {status}: {exc}")
    return DataError(f"{what}: request to {endpoint} failed: {exc}")
