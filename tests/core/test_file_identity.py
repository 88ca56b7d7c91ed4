"""File identity catches same-size edits away from a file's end: lines reordered in place at
the start of a JSON Lines file, a row group rewritten in the middle of a Parquet file. A
resume over such a file is refused naming it, and a run that meets it names it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.kit.edits import reorder_lines
from tests.kit.state import resealed
from zephon import Pipeline
from zephon.errors import DataError, StateMismatchError
from zephon.io import Dataset
from zephon.io import file_identity as identity
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def write_lines(path: Path, count: int, seed: int = 0) -> Path:
    """``count`` JSON lines of varied lengths (about 100 bytes each)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"line {i} " + " ".join(
        rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(5, 25)))})
        + "\n" for i in range(count)))
    return path


def test_where_a_file_is_sampled_follows_from_its_size_alone():
    assert identity.sampled_ranges(100) == []
    assert identity.sampled_ranges(identity.TAIL_BYTES) == []
    small = identity.TAIL_BYTES + 1000  # the rest no longer than the blocks: read whole
    assert identity.sampled_ranges(small) == [(0, 1000)]
    size = 10 << 20
    ranges = identity.sampled_ranges(size)
    assert len(ranges) == identity.SAMPLED_BLOCKS and ranges[0][0] == 0
    last = ranges[-1]
    assert last[0] + last[1] == size - identity.TAIL_BYTES
    assert identity.largest_gap(size) <= (size - identity.TAIL_BYTES) // 4


def test_an_edit_longer_than_the_gap_is_caught_wherever_it_is(tmp_path):
    """Every run of bytes one longer than the largest gap between sampled blocks, at every
    position before the tail (in steps), changes the version."""
    path = tmp_path / "f.bin"
    data = random.Random(3).randbytes(200_000)
    path.write_bytes(data)
    size, version = identity.file_version(str(path))
    run = identity.largest_gap(size) + 1
    for at in range(0, size - identity.TAIL_BYTES - run + 1, 997):
        changed = bytearray(data)
        changed[at:at + run] = bytes(b ^ 0x5A for b in changed[at:at + run])
        path.write_bytes(bytes(changed))
        now_size, now = identity.file_version(str(path))
        assert now_size == size and now != version, f"a run at {at} was missed"
        assert now.partition("-")[0] == version.partition("-")[0]  # the tail as it was
    path.write_bytes(data)
    assert identity.file_version(str(path)) == (size, version)


def pipeline_over(folder: Path, tokenizer_dir: str) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("web", str(folder))],
                                     MixtureSpec({"web": 1.0}), seed=5, unit_bytes=4096)
    return (Pipeline(source).options(lanes=2, prefetch=0).tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(33).batch(2))


def test_a_resume_over_lines_reordered_in_place_is_refused_naming_the_file(tmp_path,
                                                                         tokenizer_dir):
    """The first 300 lines of a file reordered in place (same size, last 4 KiB as they were)
    resumed without a word: 58 documents were read twice and 83 never."""
    folder = tmp_path / "data"
    part = write_lines(folder / "part-0.jsonl", 400)
    write_lines(folder / "part-1.jsonl", 400, seed=2)
    pipeline = pipeline_over(folder, tokenizer_dir)
    iterator = iter(pipeline)
    for _ in range(5):
        next(iterator)
    state = pipeline.state_dict()
    tail = part.read_bytes()[-identity.TAIL_BYTES:]
    reorder_lines(part, 0, 300)
    assert part.read_bytes()[-identity.TAIL_BYTES:] == tail
    with pytest.raises(StateMismatchError, match=r"the datasets or their files .*changed "
                                                 r"\(work_source\.datasets\.web\.versions\."
                                                 r"part-0\.jsonl: checkpoint"):
        pipeline_over(folder, tokenizer_dir).load_state_dict(resealed(state))


def write_groups(path: Path, groups: list[list[str]]) -> None:
    """Texts in one row group a list, uncompressed and without statistics or dictionaries:
    texts of the same lengths give a file of the same size and the same footer."""
    table = pa.table({"text": [t for g in groups for t in g]})
    pq.write_table(table, path, row_group_size=len(groups[0]), compression="NONE",
                   use_dictionary=False, write_statistics=False)


def test_a_same_size_edit_in_the_middle_of_a_parquet_file_is_caught(tmp_path, tokenizer_dir):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "a.parquet"
    groups = [[f"group {g} text {i} " + "abcd " * (20 + i % 7) for i in range(64)]
              for g in range(8)]
    write_groups(path, groups)
    before = path.read_bytes()
    listed = Dataset.from_path("web", str(folder)).fingerprint()
    pipeline = pipeline_over(folder, tokenizer_dir)
    iterator = iter(pipeline)
    next(iterator)
    # the middle row groups rewritten, each text as long as before; each lane has read one of
    # its 4 units and may have read the next ahead: its third is read after the edit
    # (written whole, then put in place: a unit read ahead meanwhile reads one or the other)
    edited = path.with_suffix(".new")
    write_groups(edited, [groups[0], *([t.replace("abcd", "dcba") for t in g]
                                       for g in groups[1:-1]), groups[-1]])
    edited.replace(path)
    after = path.read_bytes()
    assert len(after) == len(before) and after != before
    assert after[-identity.TAIL_BYTES:] == before[-identity.TAIL_BYTES:]
    with pytest.raises(DataError, match=r"a\.parquet: changed during the run \(its bytes "
                                        r"before its last 4 KiB differ"):
        for _ in range(2000):  # about 125 microbatches a unit; 8 units
            next(iterator)
    now = Dataset.from_path("web", str(folder)).fingerprint()  # and a resume is refused
    assert now["files"] == listed["files"] and now["versions"] != listed["versions"]


def test_a_checkpoint_from_before_sampled_versions_is_refused_saying_so(tmp_path,
                                                                        tokenizer_dir):
    folder = tmp_path / "data"
    write_lines(folder / "part-0.jsonl", 200)
    pipeline = pipeline_over(folder, tokenizer_dir)
    next(iter(pipeline))
    state = pipeline.state_dict()
    for entry in state.values():  # as written when versions were tail digests
        del entry["fingerprint"]["work_source"]["datasets"]["web"]["file_identity"]
    with pytest.raises(StateMismatchError, match=r"work_source\.datasets\.web\.file_identity: "
                                                 r"checkpoint None, now 'size, last 4 KiB and "
                                                 r"5 blocks of 256 bytes'"):
        pipeline_over(folder, tokenizer_dir).load_state_dict(resealed(state))


def test_a_read_failing_on_a_file_changed_meanwhile_says_that_it_changed(tmp_path):
    """A unit read ahead may be read while the file is rewritten: the reader's error (bytes of
    two versions) is reported as the change it is; an unchanged file's error is left as it
    is."""
    folder = tmp_path / "data"
    write_lines(folder / "part-0.jsonl", 50)
    write_lines(folder / "part-1.jsonl", 50)
    dataset = Dataset.from_path("web", str(folder))
    changed, unchanged = dataset.files()
    cut_short = r"part-0\.jsonl: changed during the run \(\d+ bytes when listed, 9 now\)"
    with pytest.raises(DataError, match=cut_short), dataset.local_file(changed) as local:
        Path(local).write_text("truncated")
        raise ValueError("a line cut short")
    with pytest.raises(ValueError, match="a line cut short"), \
            dataset.local_file(unchanged):
        raise ValueError("a line cut short")
