"""``az://container/prefix``: Azure Blob Storage, through ``obstore`` (the ``az`` extra).

Credentials never come from a recipe. They are read from the variables the Azure portal, the
SDKs, Azurite and the ``az`` CLI use, in this order:

1. ``AZURE_STORAGE_CONNECTION_STRING``: the account (``AccountName``), its key
   (``AccountKey``) or a SAS token (``SharedAccessSignature``) and the endpoint
   (``BlobEndpoint``, else ``DefaultEndpointsProtocol`` with ``EndpointSuffix``);
   ``UseDevelopmentStorage=true`` names Azurite on its default port. A connection string for
   another account than the path option ``account`` is not used;
2. the account key: ``AZURE_STORAGE_ACCOUNT_KEY``, else ``AZURE_STORAGE_KEY`` (the CLI's);
3. a SAS token: ``AZURE_STORAGE_SAS_TOKEN``;
4. otherwise ``obstore``'s own chain: workload identity (AKS), managed identity, the Azure CLI.

The storage account is the path option ``account``, else the connection string's, else
``AZURE_STORAGE_ACCOUNT_NAME``, else ``AZURE_STORAGE_ACCOUNT`` (the CLI's), else the one the
connection string's ``BlobEndpoint`` names. The path option
``endpoint`` (else ``AZURE_STORAGE_ENDPOINT``, else the connection string's) overrides the
service URL (``https://<account>.blob.core.windows.net``): Azurite, or a private endpoint.
With an ``http://`` endpoint, plain HTTP is allowed.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from zephon.errors import ConfigError
from zephon.io.storage.obstore_bucket import NO_RETRIES, ObstoreBucket, client_options
from zephon.io.store_options import StoreOptions

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
DEVELOPMENT_ACCOUNT = "devstoreaccount1"
DEVELOPMENT_ENDPOINT = f"http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT}"
DEVELOPMENT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                   "KBHBeksoGMGw==")
"""The account and key of Azure's storage emulators (published by Microsoft; no secret), and
Azurite's default Blob endpoint: what ``UseDevelopmentStorage=true`` stands for."""


def open_bucket(container: str, io: StoreOptions, *, account: str | None = None,
                endpoint: str | None = None) -> ObstoreBucket:
    """The Azure Blob container ``container`` (see the module docstring)."""
    from obstore.store import AzureStore

    settings = connection_string(os.environ.get(CONNECTION_STRING, ""), container)
    development = settings.get("usedevelopmentstorage", "").lower() == "true"
    named = settings.get("accountname") or (DEVELOPMENT_ACCOUNT if development else None)
    if account and named and named != account:
        settings, development, named = {}, False, None
    account = (account or named or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
               or os.environ.get("AZURE_STORAGE_ACCOUNT")
               or _account_of(settings.get("blobendpoint", "")))
    if not account:
        raise ConfigError(f"az://{container}: no storage account: set "
                          f"{CONNECTION_STRING}, AZURE_STORAGE_ACCOUNT_NAME (or the az CLI's "
                          "AZURE_STORAGE_ACCOUNT), or the path option account=...")
    config: dict[str, Any] = {"account_name": account}
    key_variable = next((v for v in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY")
                         if os.environ.get(v)), None)
    if settings.get("accountkey"):
        source = f"{CONNECTION_STRING} (AccountKey)"
        config["account_key"] = settings["accountkey"]
    elif settings.get("sharedaccesssignature"):
        source = f"{CONNECTION_STRING} (SharedAccessSignature)"
        config["sas_key"] = settings["sharedaccesssignature"].lstrip("?")
    elif development:
        source = f"{CONNECTION_STRING} (UseDevelopmentStorage: the emulator's published key)"
        config["account_key"] = DEVELOPMENT_KEY
    elif key_variable:
        source = f"the environment ({key_variable})"
        config["account_key"] = os.environ[key_variable]
    elif os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
        source = "the environment (AZURE_STORAGE_SAS_TOKEN)"
        config["sas_key"] = os.environ["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")
    else:
        source = ("none in the environment; workload identity, managed identity or the Azure "
                  "CLI, if any")
    endpoint, endpoint_source = _endpoint(endpoint, settings, account, development)
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"az endpoint {endpoint!r} must start with http:// or https://")
        config["endpoint"] = endpoint.rstrip("/")
    store = AzureStore(container, config=config, client_options=client_options(io, endpoint),
                       retry_config=NO_RETRIES)
    where = f" at {config['endpoint']}" if endpoint else ""
    service = (f"{config['endpoint']} ({endpoint_source})" if endpoint else
               f"https://{account}.blob.core.windows.net (Azure, account {account})")
    return ObstoreBucket(f"az://{container}", store, f"account {account}, {source}{where}", io,
                         service)


def connection_string(text: str, container: str) -> dict[str, str]:
    """The settings of an Azure Storage connection string (``Key=value;...``), by lowercase
    key; {} for an empty one. A value may hold ``=`` (keys, SAS tokens)."""
    settings: dict[str, str] = {}
    for number, part in enumerate(text.split(";"), 1):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not key.strip().isalnum():
            raise ConfigError(f"az://{container}: {CONNECTION_STRING} is not a connection "
                              "string (Name=value pairs separated by ';'): its part "
                              f"{number} is not one")
        settings[key.strip().lower()] = value.strip()
    return settings


def _account_of(endpoint: str) -> str | None:
    """The account a Blob endpoint names: ``https://<account>.blob.core.windows.net``, or an
    emulator's ``http://host:port/<account>``."""
    parsed = urlsplit(endpoint)
    host = parsed.hostname or ""
    if ".blob." in host:
        return host.split(".", 1)[0]
    return parsed.path.strip("/").split("/", 1)[0] or None


def _endpoint(option: str | None, settings: dict[str, str], account: str,
              development: bool) -> tuple[str | None, str]:
    """The Blob service URL, and where it was found (None: Azure's default for the
    account)."""
    if option:
        return option, "the path option endpoint"
    if os.environ.get("AZURE_STORAGE_ENDPOINT"):
        return os.environ["AZURE_STORAGE_ENDPOINT"], "AZURE_STORAGE_ENDPOINT"
    if settings.get("blobendpoint"):
        return settings["blobendpoint"], f"BlobEndpoint of {CONNECTION_STRING}"
    if development:
        return DEVELOPMENT_ENDPOINT, f"UseDevelopmentStorage of {CONNECTION_STRING}"
    if settings.get("endpointsuffix"):
        protocol = settings.get("defaultendpointsprotocol", "https")
        return (f"{protocol}://{account}.blob.{settings['endpointsuffix']}",
                f"EndpointSuffix of {CONNECTION_STRING}")
    return None, ""
