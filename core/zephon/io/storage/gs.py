"""``gs://bucket/prefix``: Google Cloud Storage, through ``obstore`` (the ``gs`` extra).

Credentials never come from a recipe. They are looked for in the order Google's tools use:

1. ``STORAGE_EMULATOR_HOST`` (an emulator such as fake-gcs-server): no credentials, requests
   go to that URL;
2. a service-account key file: ``GOOGLE_SERVICE_ACCOUNT`` or
   ``GOOGLE_APPLICATION_CREDENTIALS``;
3. otherwise ``obstore``'s own chain: gcloud's application default credentials and the
   metadata server of a GCE/GKE instance.

The path option ``endpoint`` overrides the service URL (a private endpoint or an emulator).
"""

from __future__ import annotations

import os
from typing import Any

from zephon.errors import ConfigError
from zephon.io.storage.obstore_bucket import NO_RETRIES, ObstoreBucket, client_options
from zephon.io.store_options import StoreOptions


def open_bucket(bucket: str, io: StoreOptions, *, endpoint: str | None = None
                ) -> ObstoreBucket:
    """The GCS bucket ``bucket`` (see the module docstring)."""
    from obstore.store import GCSStore

    config: dict[str, Any] = {}
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    endpoint = endpoint or emulator
    key_file = (os.environ.get("GOOGLE_SERVICE_ACCOUNT")
                or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"))
    if endpoint and endpoint == emulator:
        source = "none (STORAGE_EMULATOR_HOST names an emulator)"
        config["skip_signature"] = True
    elif key_file:
        if not os.path.isfile(key_file):
            raise ConfigError(f"gs://{bucket}: the service-account key file {key_file!r} "
                              "(GOOGLE_APPLICATION_CREDENTIALS) does not exist")
        source = f"the service-account key file {key_file}"
        config["service_account"] = key_file
    else:
        source = ("none in the environment; gcloud's application default credentials or the "
                  "instance's metadata server, if any")
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            endpoint = "http://" + endpoint  # STORAGE_EMULATOR_HOST is often host:port
        config["base_url"] = endpoint.rstrip("/")
    store = GCSStore(bucket, config=config, client_options=client_options(io, endpoint),
                      retry_config=NO_RETRIES)
    where = f" at {config['base_url']}" if endpoint else ""
    service = (f"{config['base_url']} ("
               f"{'STORAGE_EMULATOR_HOST' if endpoint == emulator else 'the path option endpoint'})"
               if endpoint else "https://storage.googleapis.com (Google Cloud Storage)")
    return ObstoreBucket(f"gs://{bucket}", store, source + where, io, service)
