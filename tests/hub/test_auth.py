"""Tokens, gated and private datasets, retries with backoff, and errors that are not retried."""

from __future__ import annotations

import itertools
import os
import time

import pytest
from huggingface_hub import constants

from tests.hub.hubdata import docs, fast_options, sharded
from tests.kit.hub import HINTS, load, read_texts
from zephon.errors import ConfigError, DataError

PATH = "hf://org/gated/train"


@pytest.fixture
def gated(hub):
    texts = docs(40, seed=41)
    hub.create("org/gated", sharded(texts, 2, "data/train-{i:05d}-of-{n:05d}.parquet"),
               gated=True, tokens=("hf_good",))
    return texts


def test_gated_without_token_says_how_to_log_in(hub, gated, io_options):
    with pytest.raises(DataError) as info:
        load(PATH, io_options).files()
    message = str(info.value)
    assert "gated" in message and "hf auth login" in message and "HF_TOKEN" in message
    assert f"{hub.url}/datasets/org/gated" in message
    assert hub.count("/resolve/") == 0


def test_gated_with_hf_token(hub, gated, io_options, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert sorted(read_texts(load(PATH, io_options))) == sorted(gated)
    assert all(r.authorized for r in hub.log("/api/|/resolve/"))


def test_gated_with_the_token_saved_by_login(hub, gated, io_options):
    os.makedirs(os.path.dirname(constants.HF_TOKEN_PATH), exist_ok=True)
    with open(constants.HF_TOKEN_PATH, "w") as fh:
        fh.write("hf_good\n")
    assert sorted(read_texts(load(PATH, io_options))) == sorted(gated)


def test_gated_with_a_token_that_has_no_access_is_not_retried(hub, gated, io_options,
                                                              monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(DataError, match=r"your Hugging Face token has no access to it\. Accept"):
        load(PATH, io_options).files()
    refused = hub.log("/resolve/")
    assert {r.status for r in refused} == {403}
    assert len({r.path for r in refused}) == len(refused)  # one request per file, no retry


def test_private_dataset_without_token(hub, io_options):
    hub.create("org/private", sharded(docs(8, seed=1), 1, "train.parquet"), private=True,
               tokens=("hf_mine",))
    with pytest.raises(DataError) as info:
        load("hf://org/private/train", io_options).files()
    message = str(info.value)
    assert "dataset org/private was not found" in message
    assert "private or gated" in message and "hf auth login" in message
    assert [r.status for r in hub.log("/api/datasets/")] == [401]
    assert load("hf://org/private/train", io_options, token="hf_mine").files()


def test_missing_dataset_404_is_not_retried(hub, io_options, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_any")
    hub.fail(r"/api/datasets/org/missing", 404, times=5, headers={"X-Error-Code": "RepoNotFound"})
    with pytest.raises(DataError, match=r"dataset org/missing was not found on .*your Hugging "
                                        r"Face token cannot read it"):
        load("hf://org/missing/train", io_options).files()
    assert hub.count("/api/datasets/org/missing") == 1


def test_missing_file_404_names_the_file(hub, gated, io_options, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    dataset = load(PATH, io_options)
    dataset.files()
    hub.fail(r"/resolve/.*train-00001", 404, times=5, headers={"X-Error-Code": "EntryNotFound"})
    with pytest.raises(DataError, match=r"downloading hf://org/gated@\w+/data/train-00001-of-"
                                        r"00002\.parquet: the file does not exist"), \
            dataset.local_file(dataset.files()[1]):
        pass
    assert hub.count("/resolve/.*train-00001") == 2  # the footer read, then one refused download


def test_429_waits_as_long_as_retry_after_says(hub, gated, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    hub.fail(r"/revision/main$", 429, times=2, headers={"Retry-After": "1"})
    dataset = load(PATH, fast_options(tmp_path / "c", retry_max_wait_s=2.0))
    assert dataset.files()
    attempts = hub.log(r"/revision/main$")
    assert [r.status for r in attempts] == [429, 429, 200]
    gaps = [b.time - a.time for a, b in itertools.pairwise(attempts)]
    assert all(gap >= 0.95 for gap in gaps), gaps  # the backoff alone would wait ~0.01 s


def test_retry_after_is_capped_by_the_maximum_wait(hub, gated, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    hub.fail(r"/revision/main$", 429, times=2, headers={"Retry-After": "3600"})
    started = time.monotonic()
    dataset = load(PATH, fast_options(tmp_path / "c", retry_max_wait_s=0.2))
    assert dataset.files()
    assert time.monotonic() - started < 10  # not two hours
    attempts = hub.log(r"/revision/main$")
    assert [r.status for r in attempts] == [429, 429, 200]
    gaps = [b.time - a.time for a, b in itertools.pairwise(attempts)]
    assert all(0.15 <= gap < 5 for gap in gaps), gaps


def test_500_then_recovery_on_listing_and_download(hub, gated, io_options, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    hub.fail(r"/tree/", 500, times=2)
    dataset = load(PATH, io_options)
    dataset.plan(HINTS, 1)
    assert [r.status for r in hub.log("/tree/")] == [500, 500, 200]
    hub.fail(r"/cdn/.*train-00000", 503, times=2)
    assert sorted(read_texts(dataset)) == sorted(gated)
    downloads = [r.status for r in hub.log("/cdn/.*train-00000") if not r.range]
    assert downloads == [503, 503, 200]


def test_persistent_500_fails_after_max_retries(hub, gated, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    hub.fail(r"/revision/main$", 500, times=10)
    with pytest.raises(DataError, match="answered HTTP 500"):
        load(PATH, fast_options(tmp_path / "c", max_retries=2)).files()
    assert hub.count(r"/revision/main$") == 3


def test_hub_data_needs_the_cache(hub, gated):
    from zephon.io import Dataset, StoreOptions

    with pytest.raises(ConfigError) as info:
        Dataset.from_path("d", PATH).bind(StoreOptions())
    assert "CacheOptions(enabled=True, root=" in str(info.value)
    assert "limit_bytes" in str(info.value)


def test_a_refused_endpoint_fails_within_seconds_naming_it_and_the_token(hub, tmp_path,
                                                                         monkeypatch):
    """A mistyped HF_ENDPOINT (nothing listens there) is not an outage to wait out: with the
    default retry settings, whose backoff takes minutes, the error comes within seconds."""
    from tests.objectstore.servers import refused_endpoint
    from zephon.io import CacheOptions, StoreOptions

    monkeypatch.setenv("HF_TOKEN", "hf_good")
    options = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "c")),
                           show_progress=False)
    with refused_endpoint() as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        started = time.monotonic()
        with pytest.raises(DataError) as info:
            load(PATH, options).files()
        assert time.monotonic() - started < 15
    message = str(info.value)
    assert f"cannot connect to {url} (HF_ENDPOINT): connection refused" in message
    assert "token: the environment (HF_TOKEN)" in message and "hf_good" not in message
