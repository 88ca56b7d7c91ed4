"""Fixtures of the object-store tests: moto's S3 server and a fault proxy in front of it,
with credentials in the environment and no AWS profile of the user's in reach."""

from __future__ import annotations

import logging

import pytest

from tests.objectstore.servers import (
    AZURITE_BIN,
    AzuriteServer,
    FaultProxy,
    GCSServer,
    S3Server,
    azure_environment,
    gcs_environment,
    s3_environment,
)

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request


@pytest.fixture(scope="module")
def s3_server():
    server = S3Server()
    yield server
    server.close()


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """The S3 server as the AWS tools would find it: endpoint and keys in the environment."""
    s3_environment(monkeypatch, tmp_path, s3_server.url)
    return s3_server


@pytest.fixture
def proxy(s3, monkeypatch):
    """A fault proxy in front of the S3 server, which the loader is pointed at."""
    front = FaultProxy(s3.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
    yield front
    front.close()


@pytest.fixture(scope="module")
def gcs_server():
    server = GCSServer()
    yield server
    server.close()


@pytest.fixture
def gs(gcs_server, monkeypatch):
    """fake-gcs-server as Google's tools find an emulator: STORAGE_EMULATOR_HOST."""
    gcs_environment(monkeypatch, gcs_server)
    return gcs_server


@pytest.fixture(scope="module")
def azurite_server():
    if not AZURITE_BIN.exists():
        pytest.fail(f"Azurite is not installed at {AZURITE_BIN}: run make install (npm)")
    server = AzuriteServer()
    yield server
    server.close()


@pytest.fixture
def az(azurite_server, monkeypatch):
    """Azurite with its development account in the environment, as Azure's tools find it."""
    azure_environment(monkeypatch, azurite_server)
    return azurite_server


@pytest.fixture(params=["s3", "gs", "az"])
def store(request):
    """Each object store's server, with its scheme: ``(scheme, server)``."""
    return request.param, request.getfixturevalue(request.param)
