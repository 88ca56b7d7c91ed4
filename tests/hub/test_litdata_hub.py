"""A LitData dataset uploaded to the Hub (``train/index.json`` beside its chunks) read by
split: the index is read once while resolving, its chunks are the split's files, and the
tokens are the local folder's."""

from __future__ import annotations

from tests.core import litdata_sets
from tests.kit.mds import pipeline_over, token_rows
from zephon.io import Dataset


def test_a_litdata_split_on_the_hub_gives_the_local_tokens(hub, io_options, tokenizer_dir,
                                                           tmp_path_factory):
    local = litdata_sets.build(tmp_path_factory.getbasetemp() / "litdata-sets", "batch")
    hub.create("lightning/optimized", {
        f"train/{p.name}": p.read_bytes() for p in sorted(local.iterdir())})
    dataset = Dataset.from_path("d", "hf://lightning/optimized/train").bound(io_options)
    files = dataset.files()
    assert {f.fmt for f in files} == {"litdata"} and all(f.context for f in files)
    assert [f.path for f in files] == sorted(f"train/{p.name}" for p in local.iterdir()
                                             if p.name != "index.json")
    assert dataset.resolution.source == "original"
    remote = pipeline_over("hf://lightning/optimized/train", tokenizer_dir,
                           io_options=io_options)
    assert token_rows(remote) == token_rows(pipeline_over(local, tokenizer_dir))
