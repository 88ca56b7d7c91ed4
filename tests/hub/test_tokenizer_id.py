"""A tokenizer named by Hub id: downloaded once (tokenizer files only), read from the cache
when the Hub cannot be reached, and refused at once, by name, when it cannot be had."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from zephon import ConfigError
from zephon.text import tokenizer as tokenizer_module
from zephon.text.tokenizer import TextEncoder, load_tokenizer

TEXT = "The loader reads, mixes and packs documents while training runs."


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty Hugging Face cache and no tokenizer loaded yet in this process."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(tokenizer_module, "_CACHE", {})


_HELD: list[socket.socket] = []


def unreachable(monkeypatch) -> None:
    """Point the client at a closed port on 127.0.0.1, as on a cluster without internet: a
    port this process keeps bound without listening, so connections are refused and no other
    process can take it meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(tokenizer_module, "_CACHE", {})


def ids(tokenizer) -> list[int]:
    return TextEncoder(tokenizer).encode([TEXT])[0].tolist()


def publish(hub, tokenizer_dir: str, **options) -> None:
    files = {p.name: p.read_bytes() for p in Path(tokenizer_dir).iterdir() if p.is_file()}
    files["model.safetensors"] = b"\0" * 4096  # weights: never fetched for a tokenizer
    hub.create("acme/tok", files, model=True, **options)


def test_a_hub_tokenizer_is_fetched_once_and_then_read_from_the_cache_offline(
        hub, fresh, monkeypatch, tokenizer_dir):
    publish(hub, tokenizer_dir)
    expected = ids(load_tokenizer(tokenizer_dir))
    assert ids(load_tokenizer("acme/tok")) == expected
    assert hub.count("tokenizer.json", method="GET") == 1
    assert hub.count("safetensors") == 0
    unreachable(monkeypatch)
    start = time.perf_counter()
    assert ids(load_tokenizer("acme/tok")) == expected
    assert time.perf_counter() - start < 10


def test_unreachable_hub_and_no_cached_copy_is_refused_at_once(fresh, monkeypatch):
    unreachable(monkeypatch)
    start = time.perf_counter()  # transformers asked with the id failed after about 48 s
    with pytest.raises(ConfigError, match=r"'acme/tok': the Hub \(http://127\.0\.0\.1:\d+\) "
                       r"cannot be reached and it is not in the Hugging Face cache"):
        load_tokenizer("acme/tok")
    assert time.perf_counter() - start < 10


def test_a_missing_hub_tokenizer_is_refused_at_once(hub, fresh):
    """zephon 0.2.0 retried a bad tokenizer id for about a minute before failing."""
    with pytest.raises(ConfigError, match="'acme/no-such-tokenizer': no such model repository"):
        load_tokenizer("acme/no-such-tokenizer")
    assert hub.count("acme/no-such-tokenizer") == 1


def test_a_gated_tokenizer_without_a_token_says_how_to_get_access(hub, fresh, tokenizer_dir):
    publish(hub, tokenizer_dir, gated=True, tokens=("secret",))
    with pytest.raises(ConfigError, match=r"'acme/tok' is a gated model: accept its "
                       r"conditions at http://127\.0\.0\.1:\d+/acme/tok, then log in"):
        load_tokenizer("acme/tok")
