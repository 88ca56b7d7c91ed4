"""``s3://bucket/prefix``: Amazon S3 and S3-compatible stores (MinIO, R2, Ceph), through
``obstore`` (the ``s3`` extra).

Credentials never come from a recipe. They are looked for in the order the AWS tools use:

1. the environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``);
2. the profile files: ``[profile]`` of ``AWS_SHARED_CREDENTIALS_FILE`` (``~/.aws/credentials``)
   and ``AWS_CONFIG_FILE`` (``~/.aws/config``), the profile being the path option
   ``profile``, else ``AWS_PROFILE``, else ``default``;
3. otherwise ``obstore``'s own chain: web identity (EKS), container and instance metadata.

The endpoint (an S3-compatible store) is the path option ``endpoint``, else
``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, or the profile's ``endpoint_url``; with an
endpoint, requests use path-style addressing (``endpoint/bucket/key``), which every
S3-compatible store serves. The region is ``region``, else ``AWS_REGION``,
``AWS_DEFAULT_REGION``, the profile's ``region``, else ``us-east-1``.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.io.storage.obstore_bucket import NO_RETRIES, ObstoreBucket, client_options
from zephon.io.store_options import StoreOptions


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
    return ObstoreBucket(f"s3://{bucket}", store, source + where, io, service)


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
