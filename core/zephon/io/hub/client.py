"""The Hub requests Zephon makes, through huggingface_hub, with retries and clear errors.

Requests: ``dataset_info`` at a revision (pins it to a commit and returns the dataset card's
metadata), ``list_repo_tree`` at that commit (file sizes and content hashes), ``list_repo_refs``
(only to list branches and tags when a revision does not exist), the last bytes of a Parquet
file (one HTTP range request for its footer), and whole-file downloads. The endpoint is the
``endpoint`` argument, else ``HF_ENDPOINT`` as set when the client is made, else
huggingface.co; the token is the ``token`` argument, else ``HF_TOKEN``, else the token saved by
``hf auth login`` (huggingface_hub's ``get_token``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import httpx
from huggingface_hub import HfApi, constants, get_token, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from zephon.errors import DataError, ZephonError
from zephon.io import cancel
from zephon.io.hub.retry import RetryPolicy, TransferError, explain, hub_failure
from zephon.io.retry import UNREACHABLE, GaveUp, retry_call
from zephon.logs import get_logger
from zephon.progress import progress

log = get_logger(__name__)

T = TypeVar("T")
REPO_TYPE = "dataset"
PROGRESS_EVERY_S = 5.0


def _version() -> str:
    """The installed distribution's version (without importing the package above io)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zephon")
    except PackageNotFoundError:
        return "0+unknown"


def default_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


class HubClient:
    """Requests about one dataset repository; every method retries and explains errors."""

    def __init__(self, repo_id: str, endpoint: str | None = None,
                 token: str | bool | None = None, policy: RetryPolicy | None = None,
                 timeout_s: float = 60.0):
        self.repo_id = repo_id
        self.endpoint = (endpoint or default_endpoint()).rstrip("/")
        self.endpoint_source = ("the path option endpoint" if endpoint else
                                "HF_ENDPOINT" if os.environ.get("HF_ENDPOINT") else
                                "the default")
        self.token = token
        self.policy = policy or RetryPolicy()
        self.timeout_s = timeout_s
        self.api = HfApi(endpoint=self.endpoint, token=token, library_name="zephon",
                         library_version=_version())

    def has_token(self) -> bool:
        if self.token is False:
            return False
        return bool(self.token) or get_token() is not None

    def token_source(self) -> str:
        """Where the token comes from (never the token), for errors."""
        if self.token is False:
            return "none (token=False)"
        if self.token:
            return "the token option"
        for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            if os.environ.get(variable):
                return f"the environment ({variable})"
        if get_token() is not None:
            return f"the token saved by `hf auth login` ({constants.HF_TOKEN_PATH})"
        return "none found"

    def _call(self, fn: Callable[[], T], what: str) -> T:
        try:
            return retry_call(fn, what, self.policy, hub_failure)
        except ZephonError:
            raise
        except GaveUp as gave_up:
            if gave_up.failure.kind == UNREACHABLE:
                raise DataError(
                    f"{what}: cannot connect to {self.endpoint} ({self.endpoint_source}): "
                    f"{gave_up.failure.reason}, {gave_up.retries} retries. Check the endpoint "
                    f"and that the Hub is up; token: {self.token_source()}") from None
            exc = gave_up.last
            raise explain(exc, what, self.repo_id, self.endpoint, self.has_token()) from exc
        except (HfHubHTTPError, httpx.TransportError, TransferError) as exc:
            raise explain(exc, what, self.repo_id, self.endpoint, self.has_token()) from exc

    # -- listing ---------------------------------------------------------------------------
    def info(self, revision: str) -> Any:
        """``DatasetInfo`` at ``revision`` (its ``sha`` is the commit the revision points to)."""
        what = f"reading dataset {self.repo_id} at revision {revision!r}"
        try:
            return self._call(lambda: self.api.dataset_info(
                self.repo_id, revision=revision, timeout=self.timeout_s), what)
        except ZephonError as exc:
            if isinstance(exc.__cause__, RevisionNotFoundError):
                raise type(exc)(f"{exc} {self._available_refs()}") from exc.__cause__
            raise

    def _available_refs(self) -> str:
        try:
            refs = self._call(lambda: self.api.list_repo_refs(self.repo_id,
                                                              repo_type=REPO_TYPE),
                              f"listing branches and tags of {self.repo_id}")
        except ZephonError:
            return ""
        branches = ", ".join(sorted(r.name for r in refs.branches)) or "none"
        tags = ", ".join(sorted(r.name for r in refs.tags)) or "none"
        return f"Branches: {branches}; tags: {tags}; or give a commit hash."

    def tree(self, commit: str) -> list[Any]:
        """Every file of the repository at ``commit`` (``RepoFile`` objects)."""
        def listing() -> list[Any]:
            items = self.api.list_repo_tree(self.repo_id, recursive=True, revision=commit,
                                            repo_type=REPO_TYPE)
            return [item for item in items if hasattr(item, "size")]

        return self._call(listing, f"listing the files of {self.repo_id} at {commit}")

    # -- file contents ---------------------------------------------------------------------
    def url(self, path: str, commit: str) -> str:
        return hf_hub_url(self.repo_id, path, repo_type=REPO_TYPE, revision=commit,
                          endpoint=self.endpoint)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return build_hf_headers(token=self.token, library_name="zephon", headers=extra)

    def tail(self, path: str, commit: str, nbytes: int) -> bytes:
        """The last ``nbytes`` bytes of a file (fewer when the file is smaller), by a range
        request; a server that ignores the range costs a streamed read of the whole file."""
        url = self.url(path, commit)

        def fetch() -> bytes:
            headers = self._headers({"Range": f"bytes=-{nbytes}"})
            with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                      timeout=self.timeout_s) as response:
                if response.status_code >= 400:
                    response.read()
                hf_raise_for_status(response)
                if response.status_code == 206:
                    return response.read()[-nbytes:]
                log.warning("%s ignored a range request; reading the whole of %s", self.endpoint,
                            path)
                tail = b""
                for chunk in response.iter_bytes():
                    tail = (tail + chunk)[-nbytes:]
                return tail

        return self._call(fetch, f"reading the footer of {path} at {commit}")

    def download(self, path: str, commit: str, out: BinaryIO, display: str, size: int,
                 new_check: Callable[[], Any], show_progress: bool = True) -> None:
        """Write the whole file to ``out`` (rewound on each attempt); ``new_check()`` returns a
        fresh content check with ``update(bytes)`` and ``ok()``; a mismatch is retried. Logs at
        DEBUG, except (with ``show_progress``) the progress of a download that takes more than
        a few seconds, and its end."""
        url = self.url(path, commit)
        level = logging.INFO if show_progress else logging.DEBUG

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            check = new_check()
            start = last = time.monotonic()
            done = 0
            log.debug("downloading %s (%s)", display, _human(size))
            with get_session().stream("GET", url, headers=self._headers(), follow_redirects=True,
                                      timeout=self.timeout_s) as response, \
                    progress(total=size, desc=display.rsplit("/", 1)[-1], unit="B",
                             unit_scale=True, show=show_progress) as bar:
                if response.status_code >= 400:
                    response.read()
                hf_raise_for_status(response)
                for chunk in response.iter_bytes():
                    cancel.check()
                    bar.update(len(chunk))
                    out.write(chunk)
                    check.update(chunk)
                    done += len(chunk)
                    now = time.monotonic()
                    if now - last >= PROGRESS_EVERY_S:
                        last = now
                        log.log(level, "downloading %s: %s of %s (%.0f%%, %s/s)", display,
                                _human(done), _human(size), 100 * done / max(size, 1),
                                _human(done / max(now - start, 1e-9)))
            if done != size or not check.ok():
                raise TransferError(f"{display}: received {done} bytes of {size}, or bytes that "
                                    "do not match the listed content hash")
            seconds = time.monotonic() - start
            log.log(level if seconds >= PROGRESS_EVERY_S else logging.DEBUG,
                    "downloaded %s: %d bytes in %.2f s (%s/s)", display, done, seconds,
                    _human(done / max(seconds, 1e-9)))

        self._call(attempt, f"downloading {display}")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
