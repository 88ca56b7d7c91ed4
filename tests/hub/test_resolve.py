"""Resolution against the test Hub: the README's table, sources, configs, conventions, pinning,
and how few listing requests a load makes."""

from __future__ import annotations

import collections

import pytest

from tests.hub.hubdata import (
    docs,
    fast_options,
    jsonl_bytes,
    parquet_bytes,
    readme,
    seed_datasets,
    sharded,
)
from tests.kit.hub import HINTS, load, read_texts
from zephon import Pipeline
from zephon.errors import ConfigError, DataError, StateMismatchError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


@pytest.mark.parametrize("path, revision, source, config, texts", [
    ("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train", "main", "original", "sample-10BT",
     ("fineweb", "main")),
    ("hf://HuggingFaceFW/fineweb-edu@v1.4.0/sample-10BT/train", "v1.4.0", "original",
     "sample-10BT", ("fineweb", "v1.4.0")),
    ("hf://yahma/alpaca-cleaned@~parquet/train", "refs/convert/parquet", "parquet", "default",
     ("alpaca", None)),
    ("hf://wikimedia/wikipedia/20231101.en/train", "main", "original", "20231101.en",
     ("wikipedia", "20231101.en")),
])
def test_readme_paths(hub, io_options, path, revision, source, config, texts):
    expected = seed_datasets(hub)
    dataset = load(path, io_options)
    repo = hub.repos[dataset.hub_path.repo_id]
    assert dataset.commit == hub.resolve_revision(repo, revision)
    assert dataset.resolution.source == source
    assert dataset.resolution.config == config
    want = expected[texts[0]] if texts[1] is None else expected[texts[0]][texts[1]]
    assert sorted(read_texts(dataset, min_units=7)) == sorted(want)
    assert dataset.display_name(dataset.files()[0]).startswith(
        f"hf://{dataset.hub_path.repo_id}@{dataset.commit}/")


def test_default_config_of_the_card_and_config_errors(hub, io_options):
    expected = seed_datasets(hub)
    default = load("hf://HuggingFaceFW/fineweb-edu/train", io_options)
    assert default.resolution.config == "default"
    assert [f.path for f in default.files()] == ["data/CC-MAIN-2024-10/000_00000.parquet",
                                                 "data/CC-MAIN-2024-10/001_00000.parquet"]
    assert sorted(read_texts(default)) == sorted(expected["fineweb"]["crawl"])
    with pytest.raises(ConfigError, match=r"available configs: 20231101\.en, 20231101\.fr"):
        load("hf://wikimedia/wikipedia/train", io_options).files()
    with pytest.raises(ConfigError, match="unknown config 'sample-100BT'; available configs: "
                                          "CC-MAIN-2024-10, default, sample-10BT"):
        load("hf://HuggingFaceFW/fineweb-edu/sample-100BT/train", io_options).files()
    with pytest.raises(ConfigError, match="has no split 'test'; available splits: train"):
        load("hf://wikimedia/wikipedia/20231101.fr/test", io_options).files()


def test_unknown_revision_lists_branches_and_tags(hub, io_options):
    seed_datasets(hub)
    hub.tag("HuggingFaceFW/fineweb-edu", "v1.3.0", hub.repos["HuggingFaceFW/fineweb-edu"]
            .branches["main"])
    with pytest.raises(ConfigError) as info:
        load("hf://HuggingFaceFW/fineweb-edu@v9/sample-10BT/train", io_options).files()
    message = str(info.value)
    assert "revision 'v9'" in message
    assert "Branches: main, v1.4.0; tags: v1.3.0" in message


def test_automatic_source_reads_the_conversion_of_json_arrays(hub, io_options):
    expected = seed_datasets(hub)
    auto = load("hf://yahma/alpaca-cleaned/train", io_options)
    assert auto.resolution.source == "parquet"
    assert auto.commit == hub.repos["yahma/alpaca-cleaned"].conversion
    assert sorted(read_texts(auto)) == sorted(expected["alpaca"])
    original = load("hf://yahma/alpaca-cleaned@~original/train", io_options)
    assert original.resolution.source == "original"
    assert [f.path for f in original.files()] == ["alpaca_data_cleaned.json"]
    with pytest.raises(DataError, match="expected a JSON object, got list"):
        read_texts(original)


def test_fallback_is_refused_off_main_and_without_conversion(hub, io_options):
    hub.create("org/csv", {"train.csv": b"text\nhello\n"})
    hub.push("org/csv", {"train.csv": b"text\nbye\n"}, branch="v2")
    with pytest.raises(DataError, match="no Parquet conversion"):
        load("hf://org/csv/train", io_options).files()
    with pytest.raises(ConfigError, match="conversion covers only the main branch"):
        load("hf://org/csv@v2/train", io_options).files()


def test_default_conventions_without_card(hub, io_options):
    train = docs(60, seed=11)
    test = docs(20, seed=12)
    hub.create("org/conventions", {
        "README.md": readme(None),
        "train/part-0.jsonl": jsonl_bytes([{"text": t} for t in train[:30]]),
        "train/part-1.jsonl": jsonl_bytes([{"text": t} for t in train[30:]]),
        "test/part-0.jsonl": jsonl_bytes([{"text": t} for t in test]),
        "scripts/build.py": b"print('not data')\n",
    })
    dataset = load("hf://org/conventions/train", io_options)
    assert dataset.resolution.config == "default"
    assert [f.path for f in dataset.files()] == ["train/part-0.jsonl", "train/part-1.jsonl"]
    assert all(f.version.startswith("git-sha1:") for f in dataset.files())
    units = dataset.plan(HINTS, min_units=1)
    assert len(units) > 2 and {u.kind for _, u in units} == {"bytes"}
    assert sorted(read_texts(dataset)) == sorted(train)
    assert sorted(read_texts(load("hf://org/conventions/default/test", io_options))) == \
        sorted(test)
    with pytest.raises(ConfigError, match="available splits: test, train"):
        load("hf://org/conventions/validation", io_options).files()


def test_sharded_data_dir_convention_and_paginated_listing(hub, io_options):
    hub.page_size = 3
    texts = docs(70, seed=13)
    files = sharded(texts, 7, "data/train-{i:05d}-of-{n:05d}.parquet")
    files["data/validation-00000-of-00001.parquet"] = parquet_bytes(docs(5, seed=14))
    hub.create("org/sharded", files)
    dataset = load("hf://org/sharded/train", io_options)
    assert len(dataset.files()) == 7
    assert hub.count(r"/tree/") == 3  # 8 files over pages of 3
    assert sorted(read_texts(dataset)) == sorted(texts)


def test_pinned_commit_survives_a_push_and_fingerprints_differ(hub, io_options, tmp_path):
    expected = seed_datasets(hub)
    path = "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"
    first = load(path, io_options)
    pinned = first.commit
    new = docs(40, seed=21)
    hub.push("HuggingFaceFW/fineweb-edu", sharded(new, 4, "sample/10BT/{i:03d}_00000.parquet"))
    # the first dataset keeps reading its commit, even for shards not downloaded before
    assert sorted(read_texts(first)) == sorted(expected["fineweb"]["main"])
    assert first.commit == pinned
    second = load(path, fast_options(tmp_path / "cache2"))
    assert second.commit != pinned
    assert sorted(read_texts(second)) == sorted(new)
    assert first.fingerprint()["commit"] != second.fingerprint()["commit"]

    def pipeline(dataset):
        source = StaticMixtureWorkSource([dataset], mixture=MixtureSpec({"d": 1.0}))
        return Pipeline(source).options(io_options=io_options).batch(microbatch_size=4)

    old = pipeline(Dataset.from_path("d", f"hf://HuggingFaceFW/fineweb-edu@{pinned}/"
                                          "sample-10BT/train"))
    next(iter(old))
    with pytest.raises(StateMismatchError, match="another revision"):
        pipeline(Dataset.from_path("d", path)).load_state_dict(old.state_dict())


def test_listing_is_shared_by_the_processes_of_a_node(hub, tmp_path):
    seed_datasets(hub, shards=6)
    path = "hf://wikimedia/wikipedia/20231101.en/train"
    options = fast_options(tmp_path / "node-cache")
    ranks = [load(path, options) for _ in range(4)]
    assert len({r.commit for r in ranks}) == 1
    assert all(r.fingerprint() == ranks[0].fingerprint() for r in ranks)
    for rank in ranks:
        rank.plan(HINTS, min_units=8)
    assert hub.count(r"/revision/main$") == 4  # each process pins the branch: one request
    assert hub.count(r"/tree/") == 1
    footers = [r for r in hub.log(r"/resolve/") if r.range]
    assert len(footers) == 6
    assert hub.count(r"/resolve/") == 6  # planning downloads no shard
    # with a commit in the path and a warm listing cache, resolving makes no request at all
    before = len(hub.requests)
    pinned = load(f"hf://wikimedia/wikipedia@{ranks[0].commit}/20231101.en/train", options)
    assert pinned.fingerprint()["files"] == ranks[0].fingerprint()["files"]
    pinned.plan(HINTS, min_units=8)
    assert len(hub.requests) == before


def test_parquet_units_follow_row_groups_without_downloads(hub, io_options):
    texts = docs(100, seed=31)
    hub.create("org/rg", {"data/train-00000-of-00002.parquet": parquet_bytes(texts[:60], 16),
                          "data/train-00001-of-00002.parquet": parquet_bytes(texts[60:], 7)})
    dataset = load("hf://org/rg/train", io_options)
    units = dataset.plan(HINTS, min_units=1)
    rows = collections.Counter()
    for index, unit in units:
        assert unit.kind == "row_group"
        rows[index] += unit.stop - unit.start
    assert len(units) == 4 + 6 and rows == {0: 60, 1: 40}
    assert hub.count(r"/resolve/", "GET") == 2 and all(r.range for r in hub.log("/resolve/"))
    many = dataset.plan(HINTS, min_units=40)
    assert len(many) >= 40 and sum(u.stop - u.start for _, u in many) == 100
    assert sorted(read_texts(dataset, min_units=40)) == sorted(texts)


def test_footers_are_read_even_when_the_server_ignores_ranges(hub, io_options):
    texts = docs(50, seed=32)
    hub.create("org/norange", {"train.parquet": parquet_bytes(texts, 8)})
    hub.ranges = False
    dataset = load("hf://org/norange/train", io_options)
    assert [f.row_groups for f in dataset.resolution.files] == [[8] * 6 + [2]]
    assert sorted(read_texts(dataset)) == sorted(texts)
