"""Azure credentials as the portal, the SDKs, Azurite and the ``az`` CLI give them, against
Azurite: a connection string (account key, SAS token, development storage), the CLI's
variables, and errors that name the variable without echoing its secret."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from tests.hub.hubdata import fast_options
from tests.objectstore.servers import AZURITE_ACCOUNT, AZURITE_KEY
from zephon.errors import ConfigError
from zephon.io import Dataset

DATA = {"chat/a.jsonl": b'{"text": "one"}\n', "chat/b.jsonl": b'{"text": "two"}\n'}


@pytest.fixture(scope="module")
def with_container(azurite_server):
    """Azurite with a container ``creds`` holding :data:`DATA`."""
    azurite_server.bucket("creds", DATA)
    return azurite_server


@pytest.fixture
def azurite(with_container, monkeypatch):
    """That Azurite, with no Azure variable in the environment."""
    for name in list(os.environ):
        if name.startswith("AZURE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return with_container


def read_all(tmp_path: Path, **options) -> tuple[list[bytes], str]:
    dataset = Dataset.from_path("d", "az://creds/chat/", **options).bound(
        fast_options(tmp_path / "cache"))
    contents = []
    for data_file in dataset.files():
        with dataset.local_file(data_file) as local:
            contents.append(Path(local).read_bytes())
    return contents, dataset.store.credentials


def test_a_connection_string_with_an_account_key(azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={azurite.endpoint};"))
    contents, credentials = read_all(tmp_path)
    assert contents == list(DATA.values())
    assert credentials == (f"account {AZURITE_ACCOUNT}, AZURE_STORAGE_CONNECTION_STRING "
                           f"(AccountKey) at {azurite.endpoint}")


def test_a_connection_string_with_a_sas_token_names_its_account_by_its_endpoint(
        azurite, monkeypatch, tmp_path):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        AZURITE_ACCOUNT, "creds", account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={azurite.endpoint};SharedAccessSignature={sas}")
    contents, credentials = read_all(tmp_path)
    assert contents == list(DATA.values())
    assert credentials.startswith(f"account {AZURITE_ACCOUNT}, AZURE_STORAGE_CONNECTION_STRING "
                                  "(SharedAccessSignature)")


def test_development_storage_with_the_endpoint_moved(azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true")
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", azurite.endpoint)
    assert read_all(tmp_path)[0] == list(DATA.values())


def test_the_az_cli_variables(azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
    contents, credentials = read_all(tmp_path, endpoint=azurite.endpoint)
    assert contents == list(DATA.values())
    assert credentials == (f"account {AZURITE_ACCOUNT}, the environment (AZURE_STORAGE_KEY) "
                           f"at {azurite.endpoint}")


def test_a_connection_string_for_another_account_than_the_option_is_not_used(
        azurite, monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"AccountName=other;AccountKey={AZURITE_KEY};BlobEndpoint=http://x.invalid")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
    contents, credentials = read_all(tmp_path, account=AZURITE_ACCOUNT,
                                     endpoint=azurite.endpoint)
    assert contents == list(DATA.values())
    assert "(AZURE_STORAGE_ACCOUNT_KEY)" in credentials


def test_a_malformed_connection_string_is_named_without_its_secret(azurite, monkeypatch,
                                                                    tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=x;{AZURITE_KEY[:-2]}")
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING is not a "
                                          "connection string") as info:
        read_all(tmp_path)
    assert AZURITE_KEY not in str(info.value)


def test_a_wrong_account_key_is_named_as_such_not_as_access_denied(azurite, monkeypatch,
                                                                   tmp_path):
    import base64

    from zephon.errors import DataError

    wrong = base64.b64encode(b"not the key" * 6).decode()
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", wrong)
    with pytest.raises(DataError) as info:
        read_all(tmp_path, endpoint=azurite.endpoint)
    message = str(info.value)
    assert "could not authenticate the request: the account key or SAS token is wrong" \
        in message and "(AZURE_STORAGE_KEY)" in message
    assert "access denied" not in message and wrong not in message
