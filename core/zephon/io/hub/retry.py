"""Sorting Hub failures for the retry loop, and turning Hub errors into errors that say what
to do.

Retries are :func:`zephon.io.retry.retry_call`'s, the loop the object stores use too (see it
for the backoff, ``Retry-After`` and the short budget of a refused connection or an unresolved
host name). :func:`hub_failure` sorts what the Hub client raises: answers 408, 429, 500, 502,
503 and 504, dropped or timed-out connections and a download whose bytes do not match the
listing are retried with backoff; a connection refused or a host name that does not resolve
is retried briefly, then named with the endpoint and the token's source.

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

import httpx
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.io.retry import (
    RETRY_STATUS,
    TRANSIENT,
    UNREACHABLE,
    Failure,
    RetryPolicy,
    retry_after_of,
    status_of,
    unreachable_reason,
)

__all__ = ["LOGIN", "RetryPolicy", "TransferError", "explain", "hub_failure"]


class TransferError(Exception):
    """A download ended early or its bytes do not match the listing (retried)."""


def hub_failure(exc: Exception) -> Failure | None:
    """How a failed Hub request is retried, or None when it is not (see the module
    docstring)."""
    if isinstance(exc, TransferError):
        return Failure(TRANSIENT, "transfer incomplete or not matching the listing")
    if isinstance(exc, HfHubHTTPError):
        status = status_of(exc)
        if status in RETRY_STATUS:
            return Failure(TRANSIENT, f"HTTP {status}", retry_after_of(exc))
        return None
    if isinstance(exc, httpx.TransportError):
        reason = unreachable_reason(exc)
        if reason is not None:
            return Failure(UNREACHABLE, reason)
        return Failure(TRANSIENT, type(exc).__name__)
    return None


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
