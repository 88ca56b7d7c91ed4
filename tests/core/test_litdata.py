"""LitData datasets (written by ``litdata.optimize`` itself, see litdata_sets.py) read as a
dataset: every field as written at each compression level, the same documents as the same
items in JSON Lines, exact resume, reads from an object store with no index beside the
cached chunks, and named refusals of what is not read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.core import litdata_sets
from tests.core.litdata_sets import ITEMS, item
from tests.hub.hubdata import fast_options
from tests.kit import mds as shards
from tests.kit.batches import assert_resumes_exactly
from tests.kit.buckets import BUCKETS, MemoryBucket
from zephon.errors import DataError
from zephon.io import Dataset, storage
from zephon.io.formats.litdata import LITDATA
from zephon.recipe.checks import file_fields, peek_field


@pytest.fixture(scope="module")
def litdata(tmp_path_factory):
    """Each variant's folder, written once for the session."""
    root = tmp_path_factory.getbasetemp() / "litdata-sets"
    return {variant: litdata_sets.build(root, variant) for variant in litdata_sets.VARIANTS}


@pytest.mark.parametrize("variant", list(litdata_sets.VARIANTS))
def test_every_field_reads_as_litdata_wrote_it(litdata, variant):
    dataset = Dataset.from_path("l", litdata[variant])
    assert {f.fmt for f in dataset.files()} == {"litdata"} and len(dataset.files()) >= 3
    assert dataset.skipped_files() == (
        f"{litdata[variant] / 'index.json'} (index of the litdata files beside it)",)
    rows = shards.rows_of(dataset)
    assert len(rows) == ITEMS
    for i, got in enumerate(rows):
        want = item(i)
        assert got["text"] == want["text"] and got["id"] == i and got["raw"] == want["raw"]
        assert got["score"] == want["score"] and got["flag"] is want["flag"]
        assert got["tokens"].tolist() == want["tokens"].tolist()
        assert got["tokens"].dtype == want["tokens"].dtype


def test_litdata_gives_the_documents_of_the_same_items_in_json_lines(litdata, tokenizer_dir,
                                                                     tmp_path):
    reference = shards.token_rows(shards.pipeline_over(litdata["plain"], tokenizer_dir))
    for variant in ("batch", "chunk", "sample"):
        assert shards.token_rows(shards.pipeline_over(litdata[variant], tokenizer_dir)) == reference
    jsonl = tmp_path / "items.jsonl"
    jsonl.write_text("".join(json.dumps({"text": item(i)["text"]}) + "\n"
                             for i in range(ITEMS)))

    from_litdata = shards.sorted_documents(litdata["batch"], tokenizer_dir)
    assert len(from_litdata) == ITEMS
    assert from_litdata == shards.sorted_documents(jsonl, tokenizer_dir)


def test_litdata_resumes_exactly_and_reads_from_an_object_store(litdata, tokenizer_dir,
                                                                 tmp_path):
    reference = shards.token_rows(shards.pipeline_over(litdata["batch"], tokenizer_dir))
    assert_resumes_exactly(lambda: shards.pipeline_over(litdata["batch"], tokenizer_dir),
                           stops=(1, 3, 5))
    storage.register_scheme("mem", storage.Scheme(MemoryBucket))
    try:
        BUCKETS["lit"] = {f"train/{p.name}": p.read_bytes()
                          for p in sorted(litdata["batch"].iterdir())}
        remote = shards.pipeline_over("mem://lit/train/", tokenizer_dir,
                               io_options=fast_options(tmp_path / "cache"))
        assert shards.token_rows(remote) == reference
        dataset = remote.loader().source.datasets[0]
        assert dataset.skipped_files() == (
            "mem://lit/train/index.json (index of the litdata files beside it)",)
        assert all(f.context for f in dataset.files())
        cached = list((tmp_path / "cache").rglob("*"))
        assert not [p for p in cached if p.name == "index.json"]  # chunks read without it
    finally:
        storage.unregister_scheme("mem")
        BUCKETS.clear()


def test_zephon_check_knows_the_fields_from_the_index(litdata):
    data_file = Dataset.from_path("l", litdata["plain"]).files()[0]
    kinds = {name: peek_field(data_file.path, "litdata", None, name, data_file.context)
             for name in ("text", "tokens", "id", "raw", "absent")}
    assert kinds == {"text": "text", "tokens": "list<int>", "id": "int", "raw": "bytes",
                     "absent": None}
    assert file_fields(data_file.path, "litdata", None, data_file.context) == [
        "text", "id", "tokens", "score", "flag", "raw"]


def edited_index(litdata, tmp_path, edit) -> Dataset:
    folder = tmp_path / "edited"
    shutil.copytree(litdata["plain"], folder)
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))
    return Dataset.from_path("l", folder)


def test_what_is_not_read_is_refused_by_name(litdata, tmp_path):
    def loader(index):
        index["config"]["item_loader"] = "TokensLoader"

    with pytest.raises(DataError, match=r"index\.json: items stored by LitData's TokensLoader"):
        edited_index(litdata, tmp_path / "a", loader).files()

    def pickled(index):
        index["config"]["data_format"][1] = "pickle"

    with pytest.raises(DataError, match=r"field 'id' is encoded as 'pickle'.*unpickling"):
        edited_index(litdata, tmp_path / "b", pickled).files()

    def tupled(index):
        index["config"]["data_spec"] = json.dumps(
            [1, {"type": "builtins.tuple", "context": "null", "children_spec": []}])

    with pytest.raises(DataError, match=r"builtins\.tuple pytrees"):
        edited_index(litdata, tmp_path / "c", tupled).files()


def test_missing_and_damaged_chunks_are_named(litdata, tmp_path):
    folder = tmp_path / "missing"
    shutil.copytree(litdata["plain"], folder)
    (folder / "chunk-0-2.bin").unlink()
    with pytest.raises(DataError, match=r"index\.json names 1 litdata file\(s\) that are not "
                                        r"there, e.g. .*chunk-0-2\.bin"):
        Dataset.from_path("l", folder).files()
    folder = tmp_path / "cut"
    shutil.copytree(litdata["plain"], folder)
    chunk = folder / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-9])
    with pytest.raises(DataError, match=r"chunk-0-1\.bin: (its item offsets run past|item \d+ "
                                        r"is longer)"):
        shards.rows_of(Dataset.from_path("l", folder))


def test_an_mds_index_is_not_taken_for_a_litdata_one():
    mds_index = json.dumps({"version": 2, "shards": []}).encode()
    assert LITDATA.describe(mds_index, "index.json") is None
    assert LITDATA.describe(b"not json", "index.json") is None


def test_a_saved_plan_carries_the_index_so_chunks_read_without_it(litdata, tokenizer_dir,
                                                                   tmp_path):
    from zephon.cli import main as zephon
    from zephon.recipe import DataRecipe

    folder = tmp_path / "lit"
    shutil.copytree(litdata["sample"], folder)
    body = f"""\
lanes = 2
seed = 3
prefetch = 0
[[datasets]]
name = "lit"
path = "lit"
[tokenize]
tokenizer = "{tokenizer_dir}"
"""
    (tmp_path / "listed.toml").write_text(body)
    assert zephon(["plan", str(tmp_path / "listed.toml"), "--out", str(tmp_path / "job.plan")]
                  ) == 0
    (tmp_path / "uses_plan.toml").write_text('plan = "job.plan"\n' + body)

    def batches(recipe: str) -> list[bytes]:
        pipeline = DataRecipe.from_toml(tmp_path / recipe).build(seq_len=31,
                                                                 microbatch_size=2)
        return [r.payload["input_ids"].tobytes() for _, b in zip(range(8), pipeline)
                for r in b.records]

    reference = batches("listed.toml")
    (folder / "index.json").unlink()
    assert batches("uses_plan.toml") == reference


def test_nested_rows_come_from_the_arrow_footer_litdata_writes(tmp_path_factory, tmp_path):
    folder = litdata_sets.build_chat(tmp_path_factory.getbasetemp() / "litdata-sets")
    config = json.loads((folder / "index.json").read_text())["config"]
    assert "json" in config["data_format"]  # the nested value is a binary-JSON leaf
    dataset = Dataset.from_path("chat", folder)
    rows = shards.rows_of(dataset)
    assert rows == [litdata_sets.chat_item(i) for i in range(23)]
    data_file = dataset.files()[0]
    assert peek_field(data_file.path, "litdata", None, "messages", data_file.context) == "list"
    assert data_file.path.endswith("chunk-0-0.bin")
    raw = Path(data_file.path).read_bytes()
    assert raw.endswith(b"LDARW01\0")
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    (cut / "chunk-0-0.bin").write_bytes(raw[:-8] + b"XXXXXXXX")  # no footer: binary JSON
    with pytest.raises(DataError, match=r"chunk-0-0\.bin: nested values \(messages\) in a "
                                        "chunk with no Arrow footer"):
        shards.rows_of(Dataset.from_path("chat", cut))


def test_fmt_names_the_format_that_reads_the_index(litdata):
    named = Dataset.from_path("l", litdata["plain"], fmt="litdata")
    assert {f.fmt for f in named.files()} == {"litdata"} and len(shards.rows_of(named)) == ITEMS
    other = Dataset.from_path("l", litdata["plain"], fmt="mds")  # no index of its own
    assert not any(f.context for f in other.files())


@pytest.mark.parametrize("field, value, problem", [
    ("chunk_size", 0, "is 0, must be >= 1"),
    ("chunk_size", -5, "is -5, must be >= 1"),
    ("chunk_size", 10**12, "is 1000000000000, more items than its 1027 bytes"),
    ("chunk_size", "9", r"is '9' \(str\), must be an integer"),
    ("chunk_bytes", 2**40, "is 1099511627776, must be <= 1073741824"),
    ("chunk_bytes", None, "is None, must be an integer"),
])
def test_index_values_are_checked_before_use(litdata, tmp_path, field, value, problem):
    """A chunk_size of 0 or -5 dropped that chunk's items without a word; 10**12 made
    planning build a list until memory ran out."""
    def edit(index):
        index["chunks"][2][field] = value

    with pytest.raises(DataError, match=rf"index\.json \(chunk chunk-0-2\.bin\): "
                                        rf"chunks\[2\]\.{field} {problem}"):
        edited_index(litdata, tmp_path, edit).files()


def test_index_file_names_and_encodings_are_checked(litdata, tmp_path):
    def outside(index):
        index["chunks"][1]["filename"] = "../chunk-0-1.bin"

    with pytest.raises(DataError, match=r"index\.json: chunks\[1\]\.filename is "
                                        r"'\.\./chunk-0-1\.bin', must name a file"):
        edited_index(litdata, tmp_path / "a", outside).files()

    def listed(index):
        index["config"]["data_format"] = "str"

    with pytest.raises(DataError, match=r"index\.json: config\.data_format is 'str' \(str\), "
                                        "must be a list"):
        edited_index(litdata, tmp_path / "b", listed).files()


def test_a_chunk_decompresses_no_further_than_its_index_declares(litdata, tmp_path):
    """A 65 KB chunk expanded to 4.3 GB: decompression stops one byte past the bytes the index
    declares (with room for an older LitData's header), having allocated no more."""
    folder = tmp_path / "bomb"
    shutil.copytree(litdata["chunk"], folder)
    (folder / "chunk-0-1.zstd.bin").write_bytes(shards.zstd_bomb(64 << 20))
    peak = shards.refused_peak(lambda: shards.rows_of(Dataset.from_path("l", folder)),
                        r"chunk-0-1\.zstd\.bin: decompresses to more than 938 bytes, the 898 "
                        "bytes its index declares")
    assert peak < 8 << 20


def test_frames_and_items_decompress_no_further_than_declared(litdata, tmp_path, monkeypatch):
    import struct

    from zephon.io.formats import litdata as module

    folder = tmp_path / "frames"
    shutil.copytree(litdata["batch"], folder)
    chunk = folder / "chunk-0-0.bin"
    data = bytearray(chunk.read_bytes())
    count, frames = struct.unpack_from("<I", data, 12)[0], struct.unpack_from("<I", data, 20)[0]
    assert frames == 1
    table = 24 + 4 * (count + 1)
    first, items, start, _, raw = struct.unpack_from("<IIQII", data, table)
    bomb = shards.zstd_bomb(16 << 20)
    struct.pack_into("<IIQII", data, table, first, items, start, len(bomb), raw)
    chunk.write_bytes(bytes(data[:start]) + bomb)
    with pytest.raises(DataError, match=rf"chunk-0-0\.bin: frame 0: decompresses to more than "
                                        rf"{raw} bytes, the {raw} bytes its frame table"):
        shards.rows_of(Dataset.from_path("l", folder))

    folder = tmp_path / "samples"
    shutil.copytree(litdata["sample"], folder)
    chunk = folder / "chunk-0-0.bin"
    data = chunk.read_bytes()
    count = struct.unpack_from("<I", data)[0]
    offsets = struct.unpack_from(f"<{count + 1}I", data, 4)
    bomb = shards.zstd_bomb(4 << 20)  # item 0, then the others as they were
    shifted = [offsets[0], *(o - offsets[1] + offsets[0] + len(bomb) for o in offsets[1:])]
    chunk.write_bytes(struct.pack(f"<I{count + 1}I", count, *shifted) + bomb
                      + data[offsets[1]:])
    monkeypatch.setattr(module, "MAX_CHUNK_BYTES", 1 << 20)
    with pytest.raises(DataError, match=r"chunk-0-0\.bin: item 0: decompresses to more than "
                                        r"1048576 bytes"):
        shards.rows_of(Dataset.from_path("l", folder))


def test_a_local_litdata_folder_is_listed_without_a_warning(tmp_path_factory, caplog):
    """Its index.json is the index of its chunks, the documented layout: listed among the
    skipped files, not logged."""
    import logging

    from zephon.io import Dataset

    local = litdata_sets.build(tmp_path_factory.getbasetemp() / "litdata-sets", "plain")
    with caplog.at_level(logging.INFO, logger="zephon"):
        dataset = Dataset.from_path("d", local)
        assert dataset.files()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [s for s in dataset.skipped_files() if "index.json (index of the" in s]
