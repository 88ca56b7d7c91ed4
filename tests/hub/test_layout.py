"""Configs and splits from dataset cards and from the Hub's file-naming conventions."""

from __future__ import annotations

import pytest

from zephon.errors import ConfigError
from zephon.io.hub.layout import (
    convention_splits,
    conversion_layout,
    glob_regex,
    match_patterns,
    original_layout,
)


@pytest.mark.parametrize("pattern, path, matches", [
    ("data/*.parquet", "data/a.parquet", True),
    ("data/*.parquet", "data/x/a.parquet", False),
    ("data/**/*.parquet", "data/x/y/a.parquet", True),
    ("data/**/*.parquet", "data/a.parquet", True),
    ("**", "a/b/c.jsonl", True),
    ("train-0000?.jsonl", "train-00001.jsonl", True),
    ("train-0000?.jsonl", "train-00001/.jsonl", False),
    ("part-[0-2].parquet", "part-1.parquet", True),
    ("part-[!0-2].parquet", "part-1.parquet", False),
    ("part-[!0-2].parquet", "part-7.parquet", True),
])
def test_glob_semantics(pattern, path, matches):
    assert bool(glob_regex(pattern).match(path)) is matches


@pytest.mark.parametrize("files, expected", [
    (["README.md", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
      "data/test-00000-of-00001.parquet", "data/other.parquet"],
     {"train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
      "test": ["data/test-00000-of-00001.parquet"]}),
    (["data/en.v2-00000-of-00001.parquet"], {"en.v2": ["data/en.v2-00000-of-00001.parquet"]}),
    (["train/a.jsonl", "train/b.jsonl", "dev/c.jsonl", "test_set/d.jsonl", "notes.txt"],
     {"train": ["train/a.jsonl", "train/b.jsonl"], "validation": ["dev/c.jsonl"],
      "test": ["test_set/d.jsonl"]}),
    (["data/my_train_1.jsonl", "data/en.test.jsonl", "data/valid-2.jsonl", "trainer.jsonl"],
     {"train": ["data/my_train_1.jsonl"], "test": ["data/en.test.jsonl"],
      "validation": ["data/valid-2.jsonl"]}),
    (["a.parquet", "sub/b.parquet", ".hidden/c.parquet", "__pycache__/d.parquet", "x.py"],
     {"train": ["a.parquet", "sub/b.parquet"]}),
])
def test_default_conventions(files, expected):
    found = convention_splits(files)
    assert {s: sorted(f) for s, f in found.items()} == expected


def test_without_card_there_is_one_default_config_of_the_main_format():
    layout = original_layout(["README.md", "train/a.jsonl", "train/b.jsonl", "train/c.csv",
                              "test/d.jsonl"], None)
    assert layout.default == "default"
    assert layout.configs == {"default": {"train": ["train/a.jsonl", "train/b.jsonl"],
                                          "test": ["test/d.jsonl"]}}
    assert layout.select(None, "test", "ds") == ("default", ["test/d.jsonl"])


def test_card_configs_with_globs_data_dir_and_default():
    files = ["README.md", "en/train-0.parquet", "en/train-1.parquet", "en/test-0.parquet",
             "fr/part-0.parquet", "fr/part-1.parquet", "de/data/train/x.jsonl",
             "de/data/validation/y.jsonl"]
    card = {"configs": [
        {"config_name": "en", "default": True,
         "data_files": [{"split": "train", "path": "en/train-*"},
                        {"split": "test", "path": ["en/test-*"]}]},
        {"config_name": "fr", "data_files": "fr/*.parquet"},
        {"config_name": "fr_dict", "data_files": {"train": "fr/part-0.parquet",
                                                  "test": ["fr/part-1.parquet"]}},
        {"config_name": "de", "data_dir": "de"},
        {"config_name": "de_dir", "data_dir": "de/data", "data_files": "train/*.jsonl"},
    ]}
    layout = original_layout(files, card)
    assert layout.default == "en"
    assert layout.configs["en"] == {"train": ["en/train-0.parquet", "en/train-1.parquet"],
                                    "test": ["en/test-0.parquet"]}
    assert layout.configs["fr"] == {"train": ["fr/part-0.parquet", "fr/part-1.parquet"]}
    assert layout.configs["fr_dict"] == {"train": ["fr/part-0.parquet"],
                                         "test": ["fr/part-1.parquet"]}
    assert layout.configs["de"] == {"train": ["de/data/train/x.jsonl"],
                                    "validation": ["de/data/validation/y.jsonl"]}
    assert layout.configs["de_dir"] == {"train": ["de/data/train/x.jsonl"]}


def test_unknown_config_or_split_lists_what_exists():
    card = {"configs": [{"config_name": "a", "data_files": "a/*"},
                        {"config_name": "b", "data_files": [{"split": "test", "path": "b/*"}]}]}
    layout = original_layout(["a/1.parquet", "b/2.parquet"], card)
    assert layout.default is None
    with pytest.raises(ConfigError, match=r"must name one.*available configs: a, b"):
        layout.select(None, "train", "hf://o/n/train")
    with pytest.raises(ConfigError, match="unknown config 'c'; available configs: a, b"):
        layout.select("c", "train", "hf://o/n/c/train")
    with pytest.raises(ConfigError, match="no split 'train'; available splits: test"):
        layout.select("b", "train", "hf://o/n/b/train")


def test_card_patterns_outside_the_repository_are_refused():
    with pytest.raises(ConfigError, match="outside the repository"):
        match_patterns(["a"], ["hf://datasets/o/n/a"])


def test_conversion_layouts_new_partial_and_legacy():
    files = ["default/train/0000.parquet", "default/train/0001.parquet",
             "default/partial-test/0000.parquet", "en/wiki-train.parquet",
             "en/wiki-validation-00000-of-00002.parquet",
             "en/wiki-validation-00001-of-00002.parquet", "README.md", ".gitattributes"]
    layout = conversion_layout(files, "wiki")
    assert layout.configs == {
        "default": {"train": ["default/train/0000.parquet", "default/train/0001.parquet"],
                    "test": ["default/partial-test/0000.parquet"]},
        "en": {"train": ["en/wiki-train.parquet"],
               "validation": ["en/wiki-validation-00000-of-00002.parquet",
                              "en/wiki-validation-00001-of-00002.parquet"]},
    }
    assert layout.partial == {("default", "test")}
    assert layout.default == "default"
