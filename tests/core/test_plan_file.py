"""``zephon plan`` writes a job's plan once; recipes naming it start without listing a file."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from pathlib import Path

import pytest

from benchmarks.open_counter import OpenCounter
from tests.conftest import write_parquet
from zephon.cli import main as zephon
from zephon.demo.assets import make_documents
from zephon.errors import ConfigError, DataError, StateMismatchError
from zephon.io import dataset as dataset_module
from zephon.io.dataset import Dataset
from zephon.io.formats import UnitSpec
from zephon.recipe import DataRecipe


@pytest.fixture
def planned(tmp_path, tokenizer_dir) -> dict[str, Path]:
    texts = make_documents(240, seed=5, min_words=10, max_words=60)
    for i in range(12):
        write_parquet(tmp_path / "web" / f"part-{i:02d}.parquet", texts[i * 20:(i + 1) * 20],
                      row_group_size=5)
    (tmp_path / "wiki.jsonl").write_text("".join(
        json.dumps({"text": t}) + "\n" for t in make_documents(40, seed=6)))
    body = f"""\
lanes = 4
seed = 3
prefetch = 0
[[datasets]]
name = "web"
path = "web"
weight = 0.7
[[datasets]]
name = "wiki"
path = "wiki.jsonl"
weight = 0.3
[mixture]
repeat = ["wiki"]
[tokenize]
tokenizer = "{tokenizer_dir}"
"""
    listed = tmp_path / "listed.toml"
    listed.write_text(body)
    assert zephon(["plan", str(listed), "--out", str(tmp_path / "job.plan")]) == 0
    uses_plan = tmp_path / "uses_plan.toml"
    uses_plan.write_text('plan = "job.plan"\n' + body)
    return {"listed": listed, "uses_plan": uses_plan, "plan": tmp_path / "job.plan",
            "web": tmp_path / "web"}


def _batches(recipe: Path, n: int = 12, **values) -> list[list[list[int]]]:
    pipeline = DataRecipe.from_toml(recipe).build(seq_len=31, microbatch_size=2, **values)
    out = []
    for batch in pipeline:
        out.append([list(r.payload["input_ids"]) for r in batch.records])
        if len(out) == n:
            break
    return out


def test_a_recipe_naming_a_plan_lists_no_file_and_reads_the_same_batches(planned,
                                                                          monkeypatch):
    expected = _batches(planned["listed"])
    listings = []
    original = Dataset._list_files
    monkeypatch.setattr(Dataset, "_list_files",
                        lambda self: listings.append(self.name) or original(self))
    counter = OpenCounter(planned["web"])
    try:
        recipe = DataRecipe.from_toml(planned["uses_plan"])
        pipeline = recipe.build(seq_len=31, microbatch_size=2)
        opened_to_start = counter.drain()
        got = []
        for batch in pipeline:
            got.append([list(r.payload["input_ids"]) for r in batch.records])
            if len(got) == len(expected):
                break
        opens = counter.drain()
    finally:
        counter.close()
    assert got == expected and listings == []
    assert opened_to_start == 0  # reading the recipe and building its pipeline open no file
    assert 0 < opens < 2 * 12  # only the files the first batches read, not every file twice
    assert pipeline.fingerprint() == DataRecipe.from_toml(planned["listed"]).build(
        seq_len=31, microbatch_size=2).fingerprint()


def test_the_plan_gives_its_lanes_and_refuses_other_ones(planned, tmp_path):
    open_lanes = tmp_path / "open.toml"
    open_lanes.write_text(planned["uses_plan"].read_text().replace("lanes = 4\n", ""))
    assert DataRecipe.from_toml(open_lanes).build(seq_len=31, microbatch_size=2).lanes == 4
    with pytest.raises(ConfigError, match="made for 4 lanes and this run has 8; make it again "
                                          "with zephon plan --lanes 8"):
        DataRecipe.from_toml(open_lanes).build(seq_len=31, microbatch_size=2, lanes=8)


def test_a_plan_that_does_not_fit_the_recipe_is_refused_by_name(planned, tmp_path):
    other = tmp_path / "other.toml"
    other.write_text(planned["uses_plan"].read_text().replace('name = "wiki"',
                                                              'name = "books"')
                     .replace('repeat = ["wiki"]', 'repeat = ["books"]'))
    with pytest.raises(ConfigError, match="has no dataset 'books'"):
        DataRecipe.from_toml(other)
    moved = tmp_path / "moved.toml"
    moved.write_text(planned["uses_plan"].read_text().replace('path = "wiki.jsonl"',
                                                              'path = "web/part-00.parquet"'))
    with pytest.raises(ConfigError, match="dataset 'wiki' has path = "):
        DataRecipe.from_toml(moved)
    missing = tmp_path / "missing.toml"
    missing.write_text(planned["uses_plan"].read_text().replace("job.plan", "none.plan"))
    with pytest.raises(ConfigError, match=r"none\.plan.*cannot be read"):
        DataRecipe.from_toml(missing)
    planned["plan"].write_bytes(planned["plan"].read_bytes()[:-10])
    with pytest.raises(ConfigError, match=r"job\.plan: cut short"):
        DataRecipe.from_toml(planned["uses_plan"])


def test_a_file_changed_since_the_plan_is_refused_naming_it(planned):
    for path in sorted(planned["web"].iterdir()):
        write_parquet(path, [f"new text {i}" for i in range(20)], row_group_size=5)
    pipeline = DataRecipe.from_toml(planned["uses_plan"]).build(seq_len=31, microbatch_size=2)
    with pytest.raises(DataError, match=r"web/part-\d\d\.parquet: changed during the run"):
        next(iter(pipeline))


def test_a_checkpoint_names_its_work_units_and_refuses_other_ones(planned, monkeypatch):
    """The units follow from the listing and the unit options, which the fingerprint holds,
    and from how this version of zephon cuts them, which it does not: a resume under another
    cutting would read other rows at the saved positions, so the checkpoint holds the units'
    digest too."""
    pipeline = DataRecipe.from_toml(planned["listed"]).build(seq_len=31, microbatch_size=2)
    loader = iter(pipeline)
    for _ in range(3):
        next(loader)
    state = pickle.loads(pickle.dumps(pipeline.state_dict()))
    units = next(iter(state.values()))["fingerprint"]["work_units"]
    assert sorted(units) == ["web", "wiki"] and all(len(d) == 16 for d in units.values())

    same = DataRecipe.from_toml(planned["uses_plan"]).build(seq_len=31, microbatch_size=2)
    same.load_state_dict(state)  # the saved plan cuts the same units

    def halves(groups, min_units):
        return [UnitSpec("row_group", g, s, min(s + max(1, n // 2), n))
                for g, n in enumerate(groups) for s in range(0, n, max(1, n // 2))]

    monkeypatch.setattr(dataset_module, "parquet_units", halves)
    recut = DataRecipe.from_toml(planned["listed"]).build(seq_len=31, microbatch_size=2)
    with pytest.raises(StateMismatchError, match=r"the work units cut from the files changed "
                                                  r"\(work_units\.web:"):
        recut.load_state_dict(state)


def _rewritten(path: Path, edit) -> None:
    """The plan at ``path`` with ``edit(datasets, tables)`` applied to its header's datasets
    and unit tables, sealed again (as someone editing it on purpose would)."""
    from zephon.artifacts import CHECKSUM, KIND, sealed
    from zephon.io.unit_table import UnitTable
    from zephon.work import plan_file

    data = path.read_bytes()
    start = len(plan_file.MAGIC) + 8
    length = int.from_bytes(data[len(plan_file.MAGIC):start], "little")
    header = json.loads(data[start:start + length])
    body = data[start + length:]
    tables = [UnitTable.from_bytes(body[o:o + n]) for o, n in
              (e["units"] for e in header["datasets"])]
    edit(header["datasets"], tables)
    blobs, offset = [t.to_bytes() for t in tables], 0
    for entry, blob, table in zip(header["datasets"], blobs, tables, strict=True):
        entry["units"], entry["unit_count"] = [offset, len(blob)], len(table)
        offset += len(blob)
    body = b"".join(blobs)
    fields = {k: v for k, v in header.items() if k not in (KIND, CHECKSUM)}
    fields.update(body_bytes=len(body), body_sha256=hashlib.sha256(body).hexdigest())
    text = json.dumps(sealed(plan_file.KIND, fields)).encode()
    path.write_bytes(plan_file.MAGIC + len(text).to_bytes(8, "little") + text + body)


def _units(table, rows):
    from zephon.io.unit_table import UnitTable

    return UnitTable.from_units(rows(list(table)))


@pytest.mark.parametrize("edit, message", [
    (lambda d, t: t.__setitem__(0, _units(t[0], lambda u: [u[0], *u])),
     r"units\[1\] starts at 0, but the unit before it in file 0 ends at \d+: units overlap"),
    (lambda d, t: t.__setitem__(0, _units(t[0], lambda u: u[1:])),
     r"files\[0\] has row group 0 of 5 row\(s\), which no unit reads"),
    (lambda d, t: t.__setitem__(0, _units(t[0], lambda u: [
        (u[0][0], UnitSpec(u[0][1].kind, u[0][1].group + 1, u[0][1].start, u[0][1].stop)),
        *u[1:]])), r"units\[\d+\] starts at 0, but the unit before it in file 0 ends at 5: "
                   "units overlap or leave a gap"),
    (lambda d, t: d[0]["files"].__setitem__(0, d[1]["files"][0]),
     r"files\[0\]\.path is '.*wiki\.jsonl', which is not under the dataset's path"),
    (lambda d, t: t.__setitem__(0, _units(t[0], lambda u: [(99, u[0][1]), *u[1:]])),
     r"units\[0\] names file 99, but the dataset has files 0 to 11"),
])
def test_a_plan_edited_and_sealed_again_is_refused_naming_the_field(planned, edit, message):
    """A duplicated, dropped or moved unit, a file of another dataset and a file index out
    of range each read other documents in silence before; the plan's units are now checked
    against its files."""
    _rewritten(planned["plan"], edit)
    with pytest.raises(ConfigError, match=r"dataset 'web': plan .*job\.plan: dataset 'web': "
                                          + message):
        DataRecipe.from_toml(planned["uses_plan"])


def test_any_byte_changed_in_a_plan_is_refused_by_name(planned):
    from zephon.artifacts import ArtifactError
    from zephon.work.plan_file import read_plan

    read_plan(planned["plan"])
    original = planned["plan"].read_bytes()
    rng = random.Random(7)
    changed = planned["plan"].with_name("changed.plan")
    for _ in range(300):
        data = bytearray(original)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        changed.write_bytes(bytes(data))
        with pytest.raises(ArtifactError, match=r"plan .*changed\.plan"):
            read_plan(changed)


def test_files_added_after_the_plan_are_named_at_start_and_by_check(planned, caplog, capsys):
    write_parquet(planned["web"] / "part-99.parquet", ["a late file"] * 5, row_group_size=5)
    with caplog.at_level("WARNING", logger="zephon"):
        DataRecipe.from_toml(planned["uses_plan"])
    [said] = [r.getMessage() for r in caplog.records if "not in the plan" in r.getMessage()]
    assert "1 file(s) under" in said and "part-99.parquet" in said
    assert zephon(["check", str(planned["uses_plan"])]) != 0
    shown = capsys.readouterr()
    assert "part-99.parquet: added since the plan was made (not read)" in shown.out + shown.err
    (planned["web"] / "part-99.parquet").unlink()
    (planned["web"] / "part-00.parquet").unlink()
    assert zephon(["check", str(planned["uses_plan"])]) != 0
    shown = capsys.readouterr()
    assert "part-00.parquet: in the plan but missing now" in shown.out + shown.err


def test_a_plan_made_before_sampled_file_versions_is_refused_asking_for_a_new_one(planned):
    """Version 1 plans carry no checksum and hold versions of each file's last 4 KiB only,
    which no file matches now: refused as a plan of another version, not as every file
    changed."""
    from zephon.work import plan_file

    data = planned["plan"].read_bytes()
    planned["plan"].write_bytes(plan_file.OLD_MAGIC + data[len(plan_file.MAGIC):])
    with pytest.raises(ConfigError, match=r"made by an older zephon \(plan version 1, which "
                                          r"carries no checksum\); make it again with zephon "
                                          "plan"):
        DataRecipe.from_toml(planned["uses_plan"])


def test_lines_reordered_since_the_plan_are_refused_naming_the_file(planned):
    from tests.kit.edits import reorder_lines

    wiki = planned["web"].parent / "wiki.jsonl"
    tail = wiki.read_bytes()[-4096:]
    reorder_lines(wiki, 0, 20)
    assert wiki.read_bytes()[-4096:] == tail
    pipeline = DataRecipe.from_toml(planned["uses_plan"]).build(seq_len=31, microbatch_size=2)
    with pytest.raises(DataError, match=r"wiki\.jsonl: changed during the run \(its bytes "
                                        "before its last 4 KiB differ"):
        for _ in zip(range(100), pipeline):
            pass
