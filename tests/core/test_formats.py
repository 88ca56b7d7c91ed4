"""Datasets and file formats: discovery, projection, units, and errors that name the file."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl, write_parquet
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.io.formats import PlanHints, detect_format, read_memory_pool, read_unit

HINTS = PlanHints(unit_bytes=64, arrow_unit_rows=3)


def read_all(dataset: Dataset, columns=("text",), min_units=1) -> list:
    rows = []
    for file_index, unit in dataset.plan(HINTS, min_units):
        data_file = dataset.files()[file_index]
        table, keys = read_unit(data_file.path, data_file.fmt, data_file.compression, unit,
                                list(columns) if columns else None, data_file.path)
        rows += list(zip(keys, table[columns[0]] if columns else table["text"], strict=True))
    return rows


@pytest.mark.parametrize("name, expected", [
    ("a.parquet", ("parquet", None)), ("a.jsonl", ("jsonl", None)),
    ("a.jsonl.gz", ("jsonl", "gzip")), ("a.JSONL.ZST", ("jsonl", "zstd")),
    ("a.arrow", ("arrow", None)), ("README.md", None)])
def test_detect_format(name, expected):
    assert detect_format(name) == expected


def test_jsonl_byte_units_cover_every_line_once(tmp_path):
    rows = [{"text": f"line {i} " + "x" * (i % 7), "i": i} for i in range(50)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    dataset = Dataset.from_path("a", tmp_path / "a.jsonl")
    units = dataset.plan(HINTS, 1)
    assert len(units) > 10
    texts = [t for _, t in read_all(dataset)]
    assert texts == [r["text"] for r in rows]


@pytest.mark.parametrize("suffix, opener", [(".jsonl.gz", gzip.open), (".jsonl.zst", None)])
def test_compressed_jsonl(tmp_path, suffix, opener):
    rows = [{"text": f"doc {i}"} for i in range(20)]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path = tmp_path / f"a{suffix}"
    if opener is gzip.open:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        zstandard = pytest.importorskip("zstandard")
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    dataset = Dataset.from_path("a", path)
    assert [t for _, t in read_all(dataset)] == [r["text"] for r in rows]
    assert [k for k, _ in read_all(dataset)] == list(range(1, 21))  # line numbers


def test_parquet_projection_and_units(tmp_path):
    texts = [f"t{i}" for i in range(23)]
    write_parquet(tmp_path / "p.parquet", texts, row_group_size=5)
    dataset = Dataset.from_path("p", tmp_path / "p.parquet")
    assert len(dataset.plan(HINTS, 1)) == 5
    assert len(dataset.plan(HINTS, 12)) >= 12
    assert read_all(dataset, min_units=12) == list(enumerate(texts))


def _mixed_table(rows: int) -> pa.Table:
    return pa.table({
        "text": [f"t{i}" if i % 4 else None for i in range(rows)],
        "input_ids": pa.array([list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())),
        "messages": [[{"role": "user", "content": f"q{i}"}, {"role": "assistant",
                                                            "content": f"a{i}"}]
                     for i in range(rows)],
        "meta": [{"source": f"s{i % 3}", "score": i / 7} for i in range(rows)],
        "idx": list(range(rows)),
    })


@pytest.mark.parametrize("columns", [None, ["text"], ["messages", "idx"],
                                     ["meta", "input_ids", "text"]])
def test_parquet_units_read_what_pyarrow_reads(tmp_path, columns):
    """Leaf columns of nested fields (lists, structs, lists of structs) are all read, for any
    projection, and each value equals pyarrow's own ParquetFile read."""
    path = tmp_path / "mixed.parquet"
    pq.write_table(_mixed_table(23), path, row_group_size=6)
    dataset = Dataset.from_path("m", path)
    expected_file = pq.ParquetFile(path)
    for _, unit in dataset.plan(HINTS, 1):
        table, _ = read_unit(str(path), "parquet", None, unit, columns, "mixed.parquet")
        expected = expected_file.read_row_group(unit.group, columns=columns)
        assert sorted(table) == sorted(expected.column_names)
        for name in table:
            values = table[name]
            values = [list(v) for v in values] if name == "input_ids" else list(values)
            assert values == expected.column(name).to_pylist(), name


@pytest.mark.skipif(not hasattr(pa, "uuid") or not hasattr(pa, "json_"),
                    reason="this pyarrow has no UUID or JSON extension types")
def test_parquet_extension_columns_read_as_pyarrow_reads_them(tmp_path):
    """UUID and JSON columns come back as ParquetFile gives them (UUID objects, not bytes)."""
    path = tmp_path / "ext.parquet"
    table = pa.table({"u": pa.array([uuid.UUID(int=i).bytes for i in range(4)], pa.uuid()),
                      "j": pa.array(['{"a": 1}', "[]", "2", "null"], pa.json_())})
    pq.write_table(table, path, store_schema=False)  # as written by a writer other than Arrow
    unit = Dataset.from_path("e", path).plan(HINTS, 1)[0][1]
    got, _ = read_unit(str(path), "parquet", None, unit, None, "ext.parquet")
    expected = pq.ParquetFile(path).read_row_group(0)
    assert got["u"] == expected.column("u").to_pylist() == [uuid.UUID(int=i) for i in range(4)]
    assert got["j"] == expected.column("j").to_pylist()


def test_parquet_units_are_read_into_the_loader_pool(tmp_path):
    """Token lists stay Arrow buffers while their rows are used: allocated from
    read_memory_pool, not from Arrow's default pool (see its docstring for why)."""
    path = tmp_path / "ids.parquet"
    ids = pa.array([list(range(1000)) for _ in range(200)], pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids}), path, row_group_size=200)
    unit = Dataset.from_path("i", path).plan(HINTS, 1)[0][1]
    pool = read_memory_pool()
    before = pool.bytes_allocated()
    table, _ = read_unit(str(path), "parquet", None, unit, ["input_ids"], "ids.parquet")
    assert pool.bytes_allocated() - before >= 200 * 1000 * 4
    assert list(table["input_ids"][199]) == list(range(1000))
    if pool.backend_name != pa.default_memory_pool().backend_name:
        assert pool.backend_name in ("jemalloc", "system")


def test_arrow_default_memory_pool_setting_is_respected():
    code = ("import pyarrow as pa; from zephon.io.formats import read_memory_pool; "
            "print(read_memory_pool().backend_name, pa.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"})
    assert out.stdout.split() == ["system", "system"]


def test_arrow_file_and_stream(tmp_path):
    table = pa.table({"text": [f"a{i}" for i in range(10)]})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as writer:
        writer.write_table(table)
    with pa.ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as writer:
        writer.write_table(table)
    for name in ("f.arrow", "s.arrow"):
        dataset = Dataset.from_path("a", tmp_path / name)
        assert [t for _, t in read_all(dataset)] == table.column("text").to_pylist()


def test_directory_glob_and_fmt_override(tmp_path):
    write_jsonl(tmp_path / "d" / "x.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "d" / "sub" / "y.jsonl", [{"text": "b"}])
    (tmp_path / "d" / "notes.txt").write_text("ignored")
    assert len(Dataset.from_path("d", tmp_path / "d").files()) == 2
    assert len(Dataset.from_path("d", str(tmp_path / "d" / "**" / "*.jsonl")).files()) == 2
    (tmp_path / "odd.data").write_text('{"text": "c"}\n')
    dataset = Dataset.from_path("o", tmp_path / "odd.data", fmt="jsonl")
    assert [t for _, t in read_all(dataset)] == ["c"]


def test_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        Dataset.from_path("x", tmp_path / "nope").files()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no files match|no \.parquet"):
        Dataset.from_path("x", tmp_path / "empty").files()
    with pytest.raises(ConfigError, match="fmt"):
        Dataset.from_path("x", tmp_path, fmt="csv")


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": oops}\n')
    dataset = Dataset.from_path("b", path)
    with pytest.raises(DataError, match=r"bad\.jsonl:3: malformed JSON"):
        read_all(dataset)


def test_missing_field_names_file_and_field(tmp_path):
    write_jsonl(tmp_path / "m.jsonl", [{"text": "a"}, {"body": "b"}])
    with pytest.raises(DataError, match=r"m\.jsonl:2: missing field 'text'"):
        read_all(Dataset.from_path("m", tmp_path / "m.jsonl"))
    write_parquet(tmp_path / "m.parquet", ["a"])
    with pytest.raises(DataError, match=r"m\.parquet: missing field 'content'"):
        read_all(Dataset.from_path("m", tmp_path / "m.parquet"), columns=("content",))


def test_unreadable_parquet_names_file(tmp_path):
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"broken\.parquet"):
        Dataset.from_path("b", tmp_path / "broken.parquet").plan(HINTS, 1)


def test_fingerprint_changes_with_files(tmp_path):
    write_parquet(tmp_path / "d" / "a.parquet", ["x"])
    before = Dataset.from_path("d", tmp_path / "d").fingerprint()
    pq.write_table(pa.table({"text": ["y", "z"]}), tmp_path / "d" / "a.parquet")
    assert Dataset.from_path("d", tmp_path / "d").fingerprint() != before


def test_fingerprint_ignores_location_and_mtime(tmp_path, monkeypatch):
    import os
    import shutil

    write_parquet(tmp_path / "a" / "d" / "x.parquet", ["x", "y"])
    write_jsonl(tmp_path / "a" / "d" / "sub" / "y.jsonl", [{"text": "z"}])
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # new mtimes, new location
    os.utime(tmp_path / "b" / "d" / "x.parquet", (1, 1))
    first = Dataset.from_path("d", tmp_path / "a" / "d").fingerprint()
    assert Dataset.from_path("d", tmp_path / "b" / "d").fingerprint() == first
    monkeypatch.chdir(tmp_path / "a")
    assert Dataset.from_path("d", "./d/").fingerprint() == first
    (tmp_path / "b" / "d" / "sub" / "y.jsonl").write_text('{"text": "Z"}\n')  # same size
    assert Dataset.from_path("d", tmp_path / "b" / "d").fingerprint() != first


def test_non_data_files_are_skipped_with_a_warning(tmp_path, caplog):
    write_jsonl(tmp_path / "d" / "x.jsonl", [{"text": "a"}])
    (tmp_path / "d" / "dataset_info.json").write_text("{}")
    (tmp_path / "d" / "notes.txt").write_text("hello")
    with caplog.at_level("WARNING"):
        dataset = Dataset.from_path("d", tmp_path / "d")
        files = dataset.files()
    assert [f.path.rsplit("/", 1)[-1] for f in files] == ["x.jsonl"]
    # metadata beside the data is part of its layout: listed, not logged
    assert "skipped 1 path(s)" in caplog.text and "notes.txt" in caplog.text
    assert "dataset_info.json" not in caplog.text
    assert sorted(s.rsplit("/", 1)[-1] for s in dataset.skipped_files()) == [
        "dataset_info.json (dataset metadata)", "notes.txt (not a data file)"]
    write_jsonl(tmp_path / "named.json", [{"text": "b"}])  # named directly: JSON Lines
    assert [t for _, t in read_all(Dataset.from_path("n", tmp_path / "named.json"))] == ["b"]


@pytest.mark.parametrize("name", ["found.json", "found.json.gz"])
def test_json_files_found_in_a_directory_are_read(tmp_path, name):
    rows = "".join(json.dumps({"text": t}) + "\n" for t in ("a", "b"))
    path = tmp_path / "d" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(rows.encode()) if name.endswith(".gz") else rows.encode())
    assert sorted(t for _, t in read_all(Dataset.from_path("d", tmp_path / "d"))) == ["a", "b"]


def test_files_reached_twice_are_read_once(tmp_path):
    data = tmp_path / "d"
    write_jsonl(data / "a.jsonl", [{"text": t} for t in "abc"])
    (data / "b.jsonl").symlink_to(data / "a.jsonl")  # a second name for the same file
    (data / "loop").symlink_to(data)  # a directory link loop
    write_jsonl(tmp_path / "elsewhere" / "c.jsonl", [{"text": "z"}])
    (data / "linked").symlink_to(tmp_path / "elsewhere")  # a linked directory is followed
    for path in (data, str(data / "**" / "*.jsonl")):
        dataset = Dataset.from_path("d", path)
        assert sorted(t for _, t in read_all(dataset)) == ["a", "b", "c", "z"]
        skipped = " ".join(dataset.skipped_files())
        assert "b.jsonl (same file as" in skipped or "a.jsonl (same file as" in skipped


def test_fifos_and_broken_links_are_errors_naming_them(tmp_path):
    import os

    write_jsonl(tmp_path / "d" / "ok.jsonl", [{"text": "a"}])
    os.mkfifo(tmp_path / "d" / "pipe.jsonl")
    with pytest.raises(DataError, match=r"pipe\.jsonl is a FIFO, not a regular file"):
        Dataset.from_path("d", tmp_path / "d").files()
    with pytest.raises(DataError, match=r"pipe\.jsonl is a FIFO"):
        Dataset.from_path("p", tmp_path / "d" / "pipe.jsonl").files()
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(DataError, match=r"gone\.jsonl: broken symbolic link"):
        Dataset.from_path("e", tmp_path / "e").files()
    (tmp_path / "self.jsonl").symlink_to(tmp_path / "self.jsonl")
    with pytest.raises(DataError, match=r"self\.jsonl: symbolic link that cannot be followed"):
        Dataset.from_path("s", tmp_path / "self.jsonl").files()


def test_a_relative_path_survives_a_change_of_directory(tmp_path, monkeypatch):
    from tests.conftest import write_jsonl
    from zephon.io import Dataset

    write_jsonl(tmp_path / "data" / "a.jsonl", [{"text": "one"}])
    monkeypatch.chdir(tmp_path)
    dataset = Dataset.from_path("d", "data")
    monkeypatch.chdir("/")
    assert [os.path.basename(f.path) for f in dataset.files()] == ["a.jsonl"]


def test_a_file_whose_name_holds_glob_characters_is_read_as_named(tmp_path):
    from tests.conftest import write_jsonl
    from zephon.io import Dataset

    path = write_jsonl(tmp_path / "glob[1].jsonl", [{"text": "one"}])
    write_jsonl(tmp_path / "glob1.jsonl", [{"text": "other"}])
    assert [os.path.basename(f.path) for f in Dataset.from_path("d", path).files()] == [
        "glob[1].jsonl"]


def test_json_errors_say_how_the_file_is_read(tmp_path):
    import json as json_module

    from zephon.errors import DataError
    from zephon.io import Dataset

    pretty = tmp_path / "pretty" / "rows.json"
    pretty.parent.mkdir()
    pretty.write_text(json_module.dumps([{"text": "a"}, {"text": "b"}], indent=2))
    deep = tmp_path / "deep" / "rows.jsonl"
    deep.parent.mkdir()
    deep.write_text('{"text": "ok"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")

    def read(folder):
        from zephon import Pipeline
        from zephon.work import StaticMixtureWorkSource

        return list(Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", folder)]))
                    .options(prefetch=0).batch(1, drop_last=False))

    with pytest.raises(DataError, match=r"rows\.json:\d+: malformed JSON line .*read as JSON "
                                        r"Lines.*pretty-printed"):
        read(pretty.parent)
    with pytest.raises(DataError, match=r"rows\.jsonl:2: the JSON on this line nests deeper"):
        read(deep.parent)


def test_a_column_named_twice_is_named_in_the_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon import Pipeline
    from zephon.errors import DataError
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    table = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])],
                                 names=["text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", tmp_path)]))
    with pytest.raises(DataError, match=r"dup\.parquet: column\(s\) \['text'\] appear more "
                                        r"than once"):
        list(pipeline.options(prefetch=0).batch(1, drop_last=False))


def test_each_built_in_format_is_one_module_with_the_same_protocol(tmp_path):
    """parquet, jsonl, arrow and megatron each give their suffixes, plan, read and fields;
    the dispatch sends every call to the file's module."""
    import importlib

    from zephon.io.formats import FORMATS, file_fields, plan_file

    for name in FORMATS:
        module = importlib.import_module(f"zephon.io.formats.{name}")
        assert {"SUFFIXES", "plan", "read", "fields"} <= set(dir(module)), name
        assert all(detect_format(f"x{s}")[0] == name for s in module.SUFFIXES), name
    parquet = write_parquet(tmp_path / "a.parquet", ["one", "two", "three"], row_group_size=2)
    pq.write_table(pa.table({"text": ["x"], "ids": [[1, 2]]}), tmp_path / "b.parquet")
    with pa.ipc.new_file(tmp_path / "c.arrow", pa.schema([("text", pa.string())])) as w:
        w.write_table(pa.table({"text": ["y", "z"]}))
    jsonl = write_jsonl(tmp_path / "d.jsonl", [{"text": "w", "n": 3, "ids": [4]}])
    assert file_fields(str(tmp_path / "b.parquet"), "parquet", None) == {
        "text": "text", "ids": "list<int>"}
    assert file_fields(str(tmp_path / "c.arrow"), "arrow", None) == {"text": "text"}
    assert file_fields(str(jsonl), "jsonl", None) == {"text": "text", "n": "int",
                                                       "ids": "list<int>"}
    units = plan_file(str(parquet), "parquet", None, PlanHints(1 << 20, 64))
    assert [(u.group, u.start, u.stop) for u in units] == [(0, 0, 2), (1, 0, 1)]
    (tmp_path / "e.jsonl").write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"e\.jsonl:1: expected a JSON object, got list"):
        file_fields(str(tmp_path / "e.jsonl"), "jsonl", None)
