"""The S3 requests ``obstore`` does not make, signed here with AWS Signature Version 4:

- ``HEAD <key>?partNumber=N``: a multipart object's part ``N`` as a ranged answer, whose
  ``Content-Length`` is that part's size and ``x-amz-mp-parts-count`` the number of parts. A
  multipart ETag is the MD5 of the parts' MD5s, so checking one needs the part boundaries;
- ``GET ?list-type=2``: a listing (ListObjectsV2) that keeps every key. ``obstore`` refuses a
  whole listing page when one key is not a path it can represent (an empty segment from ``//``,
  a ``.`` or ``..`` segment, a control character), though S3 allows any key; this listing
  names such keys so that they can be skipped and reported instead.

Signing needs the access key and secret (and session token), so these requests are made only
with credentials from the environment or the AWS profile files (which :mod:`.s3` reads); with
instance, container or web-identity credentials (``obstore``'s own chain) they are not
available (:func:`S3Requests.usable` is False). Each request is retried like every other
(:func:`zephon.io.retry.retry_call`).

The signature follows the AWS documentation: the canonical request (method, the URI-encoded
path, the sorted query, the signed headers ``host``, ``x-amz-content-sha256``, ``x-amz-date``
and ``x-amz-security-token``, the payload's SHA-256), the string to sign under the scope
``date/region/s3/aws4_request``, and the key derived by HMAC-SHA256 from ``AWS4<secret>``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any

from zephon.io.retry import RETRY_STATUS, TRANSIENT, UNREACHABLE, Failure, unreachable_reason

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True, slots=True)
class Credentials:
    """Static S3 credentials (never shown)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return "Credentials(***)"


@dataclass(frozen=True, slots=True)
class Answer:
    """What a signed request got back."""

    status: int
    headers: dict[str, str]
    """By lowercase name."""
    body: bytes


class RequestFailed(Exception):
    """A signed request answered with an error status (``status``; the S3 error ``code``)."""

    def __init__(self, status: int, code: str | None, text: str):
        super().__init__(f"HTTP {status}{f' {code}' if code else ''}: {text}")
        self.status = status
        self.code = code


def failure_of(exc: Exception) -> Failure | None:
    """How a failed signed request is retried (see :mod:`zephon.io.retry`)."""
    if isinstance(exc, RequestFailed):
        return Failure(TRANSIENT, f"HTTP {exc.status}") if exc.status in RETRY_STATUS else None
    if isinstance(exc, OSError):  # URLError, a reset, a timeout
        reason = unreachable_reason(exc)
        if reason is not None:
            return Failure(UNREACHABLE, reason)
        return Failure(TRANSIENT, f"{type(exc).__name__}: {exc}")
    return None


class S3Requests:
    """Signed requests to one bucket; see the module docstring. ``endpoint`` None: AWS's
    regional endpoint with virtual-hosted addressing; else path-style on that URL."""

    def __init__(self, bucket: str, region: str, endpoint: str | None,
                 credentials: Credentials | None, timeout_s: float):
        self.bucket = bucket
        self.region = region
        self.credentials = credentials
        self.timeout_s = timeout_s
        if endpoint:
            parsed = urllib.parse.urlsplit(endpoint.rstrip("/"))
            self.scheme, self.host = parsed.scheme, parsed.netloc
            self.base_path = f"{parsed.path}/{bucket}"
        else:
            self.scheme, self.host = "https", f"{bucket}.s3.{region}.amazonaws.com"
            self.base_path = ""

    @property
    def usable(self) -> bool:
        """Whether requests can be signed (static credentials are known)."""
        return self.credentials is not None

    # -- requests --------------------------------------------------------------------------
    def part(self, key: str, number: int, etag: str | None) -> tuple[int, int]:
        """(size of part ``number``, number of parts) of the object ``key``, at the version
        whose ETag is ``etag`` (``If-Match``)."""
        headers = {"If-Match": etag} if etag else {}
        answer = self.request("HEAD", key, {"partNumber": str(number)}, headers)
        size = int(answer.headers.get("content-length", "-1"))
        count = int(answer.headers.get("x-amz-mp-parts-count", "1"))
        return size, count

    def list(self, prefix: str) -> list[tuple[str, int, str]]:
        """(key, size, ETag) of every object whose key starts with ``prefix``."""
        found: list[tuple[str, int, str]] = []
        token: str | None = None
        while True:
            # keys URL-encoded: XML cannot hold every character a key may have
            query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
            if token:
                query["continuation-token"] = token
            root = ElementTree.fromstring(self.request("GET", None, query).body)
            encoded = _text(root, "EncodingType") == "url"
            for item in root.iter(f"{_NS}Contents"):
                key = _text(item, "Key")
                found.append((urllib.parse.unquote_plus(key) if encoded else key,
                              int(_text(item, "Size") or 0), _text(item, "ETag")))
            if _text(root, "IsTruncated") != "true":
                return found
            token = _text(root, "NextContinuationToken")
            if not token:
                return found

    def request(self, method: str, key: str | None, query: dict[str, str],
                headers: dict[str, str] | None = None) -> Answer:
        """One signed request on the bucket (``key`` None) or an object."""
        path = self.base_path + ("/" + key if key is not None else "/")
        canonical_path = urllib.parse.quote(path, safe="/-_.~")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted(query.items()))
        all_headers = {**(headers or {}), **self._signed(method, canonical_path,
                                                         canonical_query)}
        url = f"{self.scheme}://{self.host}{canonical_path}"
        if canonical_query:
            url += "?" + canonical_query
        request = urllib.request.Request(url, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return Answer(response.status, {k.lower(): v for k, v in response.headers.items()},
                              response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read() if method != "HEAD" else b""
            raise RequestFailed(exc.code, _code(body), _message(body) or str(exc.reason)
                                ) from None

    # -- signing -----------------------------------------------------------------------------
    def _signed(self, method: str, canonical_path: str, canonical_query: str
                ) -> dict[str, str]:
        """The headers that sign the request (AWS Signature Version 4)."""
        credentials = self.credentials
        if credentials is None:
            raise RuntimeError("S3Requests without credentials cannot sign")
        now = datetime.datetime.now(datetime.UTC)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": self.host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
        if credentials.session_token:
            headers["x-amz-security-token"] = credentials.session_token
        names = sorted(headers)
        canonical = "\n".join([method, canonical_path, canonical_query,
                               "".join(f"{name}:{headers[name].strip()}\n" for name in names),
                               ";".join(names), EMPTY_SHA256])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = f"AWS4{credentials.secret_access_key}".encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}")
        del headers["host"]  # urllib sends it
        return headers


def _text(element: Any, name: str) -> str:
    found = element.find(f"{_NS}{name}")
    if found is None:
        found = element.find(name)
    return found.text or "" if found is not None else ""


def _code(body: bytes) -> str | None:
    try:
        return ElementTree.fromstring(body).findtext("Code") if body else None
    except ElementTree.ParseError:
        return None


def _message(body: bytes) -> str | None:
    try:
        return ElementTree.fromstring(body).findtext("Message") if body else None
    except ElementTree.ParseError:
        return None
