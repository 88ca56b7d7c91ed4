"""``az://container/prefix``: Azure Blob Storage, through ``obstore`` (the ``az`` extra).

The storage account is the path option ``account``, else ``AZURE_STORAGE_ACCOUNT_NAME``.
Credentials never come from a recipe. They are looked for in this order:

1. the environment: ``AZURE_STORAGE_ACCOUNT_KEY``, else ``AZURE_STORAGE_SAS_TOKEN``;
2. otherwise ``obstore``'s own chain: workload identity (AKS), managed identity, the Azure CLI.

The path option ``endpoint`` (else ``AZURE_STORAGE_ENDPOINT``) overrides the service URL
(``https://<account>.blob.core.windows.net``): Azurite, or a private endpoint. With an
``http://`` endpoint, plain HTTP is allowed.
"""

from __future__ import annotations

import os
from typing import Any

from zephon.errors import ConfigError
from zephon.io.storage.obstore_bucket import NO_RETRIES, ObstoreBucket, client_options
from zephon.io.store_options import StoreOptions


def open_bucket(container: str, io: StoreOptions, *, account: str | None = None,
                endpoint: str | None = None) -> ObstoreBucket:
    """The Azure Blob container ``container`` (see the module docstring)."""
    from obstore.store import AzureStore

    account = account or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise ConfigError(f"az://{container}: no storage account: set "
                          "AZURE_STORAGE_ACCOUNT_NAME, or the path option account=...")
    config: dict[str, Any] = {"account_name": account}
    if os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"):
        source = "the environment (AZURE_STORAGE_ACCOUNT_KEY)"
        config["account_key"] = os.environ["AZURE_STORAGE_ACCOUNT_KEY"]
    elif os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
        source = "the environment (AZURE_STORAGE_SAS_TOKEN)"
        config["sas_key"] = os.environ["AZURE_STORAGE_SAS_TOKEN"]
    else:
        source = ("none in the environment; workload identity, managed identity or the Azure "
                  "CLI, if any")
    option = endpoint
    endpoint = endpoint or os.environ.get("AZURE_STORAGE_ENDPOINT")
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"az endpoint {endpoint!r} must start with http:// or https://")
        config["endpoint"] = endpoint.rstrip("/")
    store = AzureStore(container, config=config, client_options=client_options(io, endpoint),
                      retry_config=NO_RETRIES)
    where = f" at {config['endpoint']}" if endpoint else ""
    service = (f"{config['endpoint']} ("
               f"{'the path option endpoint' if option else 'AZURE_STORAGE_ENDPOINT'})"
               if endpoint else f"https://{account}.blob.core.windows.net (Azure, account "
               f"{account})")
    return ObstoreBucket(f"az://{container}", store, f"account {account}, {source}{where}", io,
                         service)
