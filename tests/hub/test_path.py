"""The hf:// path grammar: every row of the README's table, and clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.io.hub import HubPath, parse_hub_path


@pytest.mark.parametrize("path, expected", [
    ("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train",
     HubPath("HuggingFaceFW", "fineweb-edu", None, None, "sample-10BT", "train")),
    ("hf://HuggingFaceFW/fineweb-edu@v1.4.0/sample-10BT/train",
     HubPath("HuggingFaceFW", "fineweb-edu", "v1.4.0", None, "sample-10BT", "train")),
    ("hf://yahma/alpaca-cleaned@~parquet/train",
     HubPath("yahma", "alpaca-cleaned", None, "parquet", None, "train")),
    ("hf://wikimedia/wikipedia/20231101.en/train",
     HubPath("wikimedia", "wikipedia", None, None, "20231101.en", "train")),
    ("hf://org/name@v2~original/test",
     HubPath("org", "name", "v2", "original", None, "test")),
    ("hf://org/name@refs%2Fconvert%2Fparquet~parquet/default/validation",
     HubPath("org", "name", "refs/convert/parquet", "parquet", "default", "validation")),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567/train",
     HubPath("org", "name", "0123456789abcdef0123456789abcdef01234567", None, None, "train")),
])
def test_paths_parse(path, expected):
    parsed = parse_hub_path(path)
    assert parsed == expected
    assert parse_hub_path(str(parsed)) == parsed


@pytest.mark.parametrize("path, fragment", [
    ("hf://org/name", "needs an organization, a dataset name and a split"),
    ("hf://org/name/", "empty component"),
    ("hf://org//train", "empty component"),
    ("hf://org/name/a/b/c", "at most 2"),
    ("hf://org/name/data/train-00000-of-00001.parquet", "names a file"),
    ("hf://org/name/train.parquet", "names a file"),
    ("hf://org/name@/train", "neither a revision nor"),
    ("hf://org/name@main~arrow/train", "source 'arrow' is not one of original, parquet"),
    ("hf://org/name@v1~/train", "source '' is not one of"),
    ("hf://org/name@bad:rev/train", "not a valid branch, tag or commit"),
    ("hf://-org/name/train", "organization '-org'"),
    ("hf://org/na--me/train", "dataset name 'na--me'"),
    ("hf://org/name/tr ain", "whitespace"),
    ("hf://org/name/train?x=1", "'?'"),
    ("hf://org/name/bad-split", "split 'bad-split' is not a valid split name"),
])
def test_malformed_paths_say_what_is_wrong(path, fragment):
    with pytest.raises(ConfigError) as info:
        parse_hub_path(path)
    message = str(info.value)
    assert fragment in message
    assert "hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}" in message


@pytest.mark.parametrize("path, instead", [
    ("hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train",
     "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"),
    ("hf://datasets/yahma/alpaca-cleaned/train", "hf://yahma/alpaca-cleaned/train"),
    ("hf://datasets/org/name/data/train-00000-of-00002.parquet",
     "hf://org/name/[{config}/]{split}"),
])
def test_file_system_form_names_the_path_to_write(path, instead):
    with pytest.raises(ConfigError) as info:
        Dataset.from_path("d", path)
    message = str(info.value)
    assert "pandas, Polars and DuckDB" in message
    assert f"Write {instead} instead" in message


def test_other_file_system_kinds_are_refused():
    with pytest.raises(ConfigError, match="reads datasets only"):
        parse_hub_path("hf://models/gpt2/train")


def test_from_path_parses_eagerly_and_rejects_unknown_options():
    with pytest.raises(ConfigError):
        Dataset.from_path("d", "hf://org/name")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['revision'\]"):
        Dataset.from_path("d", "hf://org/name/train", revision="main")


_part = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_]{0,10}", fullmatch=True)
_split = st.from_regex(r"\w{1,6}(\.\w{1,4})?", fullmatch=True).filter(str.isascii)
_revision = st.one_of(st.none(), st.from_regex(r"[a-z0-9][a-z0-9./_-]{0,12}", fullmatch=True))


@given(org=_part, name=_part, revision=_revision,
       source=st.sampled_from([None, "original", "parquet"]),
       config=st.one_of(st.none(), _part), split=_split)
def test_format_and_parse_round_trip(org, name, revision, source, config, split):
    path = HubPath(org, name, revision, source, config, split)
    assert parse_hub_path(str(path)) == path
