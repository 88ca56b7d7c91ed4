"""Folders written by ``datasets.save_to_disk``: read through their ``state.json`` listing."""

from __future__ import annotations

import json

import pytest

from zephon import Pipeline
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

hf = pytest.importorskip("datasets")


def texts_of(dataset: Dataset) -> list[str]:
    """Every text the dataset delivers, through a pipeline (one pass, file order)."""
    source = StaticMixtureWorkSource([dataset], seed=0, shuffle_units=False,
                                     shuffle_rows=False)
    pipeline = Pipeline(source).batch(1, drop_last=False)
    return [r.payload["text"] for b in pipeline for r in b.records]


def save(path, texts: list[str], shards: int = 1) -> None:
    hf.Dataset.from_dict({"text": texts}).save_to_disk(str(path), num_shards=shards)


def test_a_mapped_saved_folder_is_read_once_through_its_listing(tmp_path, caplog):
    texts = [f"document {i}" for i in range(100)]
    save(tmp_path / "saved", texts, shards=2)
    hf.load_from_disk(str(tmp_path / "saved")).map(lambda row: {"text": row["text"] + "!"})
    cache = [p.name for p in (tmp_path / "saved").glob("cache-*.arrow")]
    assert cache, "map() should have written its cache file beside the data"
    dataset = Dataset.from_path("saved", tmp_path / "saved")
    with caplog.at_level("WARNING"):
        assert sorted(texts_of(dataset)) == sorted(texts)
    assert [f.path.rsplit("/", 1)[-1] for f in dataset.files()] == [
        "data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    skipped = dataset.skipped_files()
    assert f"{tmp_path / 'saved' / cache[0]} (not listed in {tmp_path / 'saved'}/state.json)" \
        in skipped
    assert cache[0] in caplog.text
    # A glob reaching the folder's files follows the listing too; a file named directly is read.
    assert len(texts_of(Dataset.from_path("g", str(tmp_path / "saved" / "*.arrow")))) == 100
    named = Dataset.from_path("c", tmp_path / "saved" / cache[0])
    assert sorted(texts_of(named)) == sorted(t + "!" for t in texts)


def test_a_saved_listing_that_names_a_missing_file_is_an_error(tmp_path):
    save(tmp_path / "saved", ["a", "b", "c", "d"], shards=2)
    (tmp_path / "saved" / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(DataError, match=r"state\.json: lists 'data-00001-of-00002\.arrow', "
                                        r"which is missing"):
        Dataset.from_path("saved", tmp_path / "saved").files()
    (tmp_path / "saved" / "state.json").write_text("{not json")
    with pytest.raises(DataError, match=r"state\.json: cannot be read as the listing"):
        Dataset.from_path("saved", tmp_path / "saved").files()
    # A state.json of something else, with no dataset_info.json beside it, is no listing.
    (tmp_path / "saved" / "dataset_info.json").unlink()
    (tmp_path / "saved" / "state.json").write_text(json.dumps({"step": 3}))
    assert sorted(texts_of(Dataset.from_path("d", tmp_path / "saved"))) == ["a", "b"]


def test_a_dataset_dict_is_read_by_split(tmp_path):
    train = hf.Dataset.from_dict({"text": [f"train {i}" for i in range(20)]})
    test = hf.Dataset.from_dict({"text": [f"test {i}" for i in range(5)]})
    folder = tmp_path / "dict"
    hf.DatasetDict({"train": train, "test": test}).save_to_disk(str(folder))
    hf.load_from_disk(str(folder / "train")).map(lambda row: {"text": row["text"] + "?"})
    with pytest.raises(ConfigError, match=r"Dataset 'd': .*dict is a DatasetDict .* splits "
                                          r"\['train', 'test'\]; reading it whole would mix"):
        Dataset.from_path("d", folder).files()
    with pytest.raises(ConfigError, match="DatasetDict"):  # a folder above it, too
        Dataset.from_path("d", tmp_path).files()
    assert sorted(texts_of(Dataset.from_path("t", folder / "train"))) == sorted(
        f"train {i}" for i in range(20))
    both = texts_of(Dataset.from_path("all", str(folder / "*")))  # the splits, named by a glob
    assert sorted(both) == sorted([f"train {i}" for i in range(20)]
                                  + [f"test {i}" for i in range(5)])
