"""``s3://bucket/prefix``: Amazon S3 and S3-compatible stores (MinIO, R2, Ceph), through
``obstore`` (the ``s3`` extra).

Credentials never come from a recipe. They are looked for in the order the AWS tools use:

1. the environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``);
2. the profile files: ``[profile]`` of ``AWS_SHARED_CREDENTIALS_FILE`` (``~/.aws/credentials``)
   and ``AWS_CONFIG_FILE`` (``~/.aws/config``), the profile being the path option
   ``profile``, else ``AWS_PROFILE``, else ``default``;
3. otherwise ``obstore``'s own chain: web identity (EKS), container and instance metadata.

With credentials of the first two kinds, the requests obstore does not make are signed here
(:mod:`zephon.io.storage.s3_requests`): a multipart object's part sizes, so that its ETag is
recomputed as it downloads, and a listing that skips and reports keys obstore cannot request
(``//``, ``.`` or ``..`` segments, control characters) instead of failing. With the third,
multipart objects are checked by size only (logged once a bucket) and such a key fails the
listing, naming it.

The endpoint (an S3-compatible store) is the path option ``endpoint``, else
``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, or the profile's ``endpoint_url``; with an
endpoint, requests use path-style addressing (``endpoint/bucket/key``), which every
S3-compatible store serves. The region is ``region``, else ``AWS_REGION``,
``AWS_DEFAULT_REGION``, the profile's ``region``, else ``us-east-1``.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from zephon.errors import ConfigError
from zephon.io.content_check import multipart_count
from zephon.io.retry import GaveUp, retry_call
from zephon.io.storage.object_info import ObjectInfo
from zephon.io.storage.obstore_bucket import (
    NO_RETRIES,
    ObstoreBucket,
    client_options,
    readable,
    unreadable_reason,
    version_of,
)
from zephon.io.storage.s3_requests import Credentials, RequestFailed, S3Requests, failure_of
from zephon.io.store_options import StoreOptions

T = TypeVar("T")


def open_bucket(bucket: str, io: StoreOptions, *, endpoint: str | None = None,
                region: str | None = None, profile: str | None = None) -> ObstoreBucket:
    """The S3 bucket ``bucket`` (see the module docstring)."""
    from obstore.store import S3Store

    profile_name = profile or os.environ.get("AWS_PROFILE") or "default"
    settings = _profile(profile_name, explicit=profile is not None)
    config: dict[str, Any] = {}
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        source = "the environment (AWS_ACCESS_KEY_ID)"
        config["access_key_id"] = os.environ["AWS_ACCESS_KEY_ID"]
        config["secret_access_key"] = os.environ["AWS_SECRET_ACCESS_KEY"]
        if os.environ.get("AWS_SESSION_TOKEN"):
            config["session_token"] = os.environ["AWS_SESSION_TOKEN"]
    elif settings.get("aws_access_key_id") and settings.get("aws_secret_access_key"):
        source = f"profile {profile_name!r} of {settings['__file__']}"
        config["access_key_id"] = settings["aws_access_key_id"]
        config["secret_access_key"] = settings["aws_secret_access_key"]
        if settings.get("aws_session_token"):
            config["session_token"] = settings["aws_session_token"]
    else:
        source = ("none in the environment or the AWS profile files; the instance, container "
                  "or web-identity credentials, if any")
    endpoint, endpoint_source = _endpoint(endpoint, settings, profile_name)
    config["region"] = (region or os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or settings.get("region")
                        or "us-east-1")
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"s3 endpoint {endpoint!r} must start with http:// or https://")
        config["endpoint"] = endpoint.rstrip("/")
        config["virtual_hosted_style_request"] = False
    store = S3Store(bucket, config=config, client_options=client_options(io, endpoint),
                    retry_config=NO_RETRIES)
    where = f" at {config['endpoint']}" if endpoint else ""
    service = (f"{config['endpoint']} ({endpoint_source})" if endpoint else
               f"https://s3.{config['region']}.amazonaws.com (AWS, region {config['region']})")
    signing = (Credentials(config["access_key_id"], config["secret_access_key"],
                           config.get("session_token")) if "access_key_id" in config else None)
    requests = S3Requests(bucket, config["region"], config.get("endpoint"), signing, io.timeout_s)
    return S3Bucket(f"s3://{bucket}", store, source + where, io, service, requests)


class S3Bucket(ObstoreBucket):
    """An S3 bucket: an :class:`ObstoreBucket` that also makes the requests obstore does not
    (:mod:`zephon.io.storage.s3_requests`), where the credentials allow signing them: the part
    sizes of multipart objects (so that their ETag is recomputed), and a listing that reports
    keys obstore cannot request instead of failing."""

    def __init__(self, url: str, store: Any, credentials: str, io: StoreOptions,
                 endpoint: str, requests: S3Requests):
        super().__init__(url, store, credentials, io, endpoint)
        self.requests = requests

    def full_listing(self, prefix: str) -> list[ObjectInfo] | None:
        if not self.requests.usable:
            return None
        found = []
        for key, size, etag in self._signed(lambda: self.requests.list(prefix),
                                            f"listing {self.url}/{prefix}", prefix):
            problem = None if readable(key) else (
                f"its key has {unreadable_reason(key)}, which the object-store client cannot "
                "request")
            found.append(ObjectInfo(key, size, version_of({"e_tag": etag, "size": size}),
                                    problem))
        return found

    def part_sizes(self, info: ObjectInfo, each: bool) -> list[int] | None:
        count = multipart_count(info.version)
        if count is None or not self.requests.usable:
            return None
        etag = f'"{info.version.partition(":")[2]}"'
        what = f"asking the part sizes of {self.url}/{info.key}"
        first, parts = self._signed(lambda: self.requests.part(info.key, 1, etag), what,
                                    info.key)
        last = info.size - first * (count - 1)
        if parts == count and not each and 0 < last <= first:
            return [first] * (count - 1) + [last]
        sizes = [first]
        for number in range(2, count + 1):
            sizes.append(self._signed(
                lambda number=number: self.requests.part(info.key, number, etag)[0], what,
                info.key))
        return sizes

    def _signed(self, fn: Callable[[], T], what: str, key: str) -> T:
        """A signed request, retried like every other; its errors named like obstore's."""
        try:
            return retry_call(fn, what, self.policy, failure_of)
        except GaveUp as gave_up:
            raise self._gave_up(gave_up) from None
        except RequestFailed as exc:
            raise self._explain(exc, what, key, listing=False) from None


def _endpoint(option: str | None, settings: dict[str, str], profile: str
              ) -> tuple[str | None, str]:
    """The endpoint of an S3-compatible store, and where it was found."""
    for value, source in ((option, "the path option endpoint"),
                          (os.environ.get("AWS_ENDPOINT_URL_S3"), "AWS_ENDPOINT_URL_S3"),
                          (os.environ.get("AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL"),
                          (settings.get("endpoint_url"),
                           f"endpoint_url of profile {profile!r}")):
        if value:
            return value, source
    return None, ""


def _profile(name: str, explicit: bool) -> dict[str, str]:
    """The settings of profile ``name`` from the credentials and config files (credentials
    win), with ``__file__`` naming the file the keys came from; {} when neither has it."""
    home = Path.home() if "HOME" in os.environ else Path("/nonexistent")
    files = [(Path(os.environ.get("AWS_CONFIG_FILE", home / ".aws" / "config")),
              "default" if name == "default" else f"profile {name}"),
             (Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE",
                                  home / ".aws" / "credentials")), name)]
    merged: dict[str, str] = {}
    for path, section in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot be read as an AWS profile file: {exc}") from None
        if parser.has_section(section):
            items = dict(parser.items(section))
            if "aws_access_key_id" in items:
                merged["__file__"] = str(path)
            merged.update(items)
    if explicit and not merged:
        raise ConfigError(f"s3 profile {name!r} is in neither {files[0][0]} nor {files[1][0]}")
    return merged
