"""Fixtures of the Hub tests: a Hub-protocol server on 127.0.0.1 that the real huggingface_hub
client talks to (through HF_ENDPOINT), with no token configured, and fast retries."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from tests.hub.hub_server import FakeHub
from tests.hub.hubdata import fast_options
from zephon.io import StoreOptions


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    # as if HF_ENDPOINT had been set before huggingface_hub was imported (it reads it then),
    # so that its own side requests stay on 127.0.0.1 too
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    yield server
    server.close()


@pytest.fixture
def io_options(tmp_path) -> StoreOptions:
    return fast_options(tmp_path / "cache")
