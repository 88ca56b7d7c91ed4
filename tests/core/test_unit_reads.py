"""Units read ahead on the reader thread: the same batches and states as units read by the
lanes themselves, errors where the lane takes the unit, and at most UNITS_AHEAD held."""

from __future__ import annotations

import gc
import hashlib
import threading
from typing import ClassVar

import pytest

from tests.conftest import write_parquet
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.engine.unit_reads import UNITS_AHEAD, UnitReads
from zephon.errors import DataError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


@pytest.fixture
def parquet_data(tmp_path):
    """Two Parquet datasets of several row groups each (the units read ahead)."""
    for name, seed in (("a", 1), ("b", 2)):
        texts = make_documents(90, seed=seed, min_words=20, max_words=120)
        for i in range(3):
            write_parquet(tmp_path / name / f"part-{i}.parquet", texts[i * 30:(i + 1) * 30],
                          row_group_size=6)
    return tmp_path


def pipeline(root, tokenizer_dir, prefetch=0):
    source = StaticMixtureWorkSource(
        [Dataset.from_path("a", root / "a"), Dataset.from_path("b", root / "b")],
        MixtureSpec({"a": 0.6, "b": 0.4}), seed=3)
    return (Pipeline(source).options(lanes=2, prefetch=prefetch)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))


def digests(batches):
    return [hashlib.sha256(b"".join(r.payload["input_ids"].tobytes() for r in b.records)
                           ).hexdigest() for b in batches]


class Counting(UnitReads):
    """Unit reads that count what they read ahead and the most slots held at once."""

    units = UNITS_AHEAD
    made: ClassVar[list[Counting]] = []

    def __init__(self):
        super().__init__(units_ahead=Counting.units)
        self.asked = self.most_held = 0
        Counting.made.append(self)

    def ask(self, read):
        pending = super().ask(read)
        self.asked += pending is not None
        self.most_held = max(self.most_held, self.held)
        return pending


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setattr("zephon.runtime.UnitReads", Counting)
    monkeypatch.setattr(Counting, "made", [])
    monkeypatch.setattr(Counting, "units", UNITS_AHEAD)
    return Counting


def take(pipeline, n):
    batches = []
    for batch in pipeline:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


@pytest.mark.parametrize("prefetch", [0, 2])
def test_units_read_ahead_give_the_same_batches_and_states(parquet_data, tokenizer_dir,
                                                           counting, prefetch):
    counting.units = 0  # every unit read by its lane, as before
    reference = digests(pipeline(parquet_data, tokenizer_dir, prefetch))
    assert counting.made[-1].asked == 0
    counting.units = UNITS_AHEAD
    assert digests(pipeline(parquet_data, tokenizer_dir, prefetch)) == reference
    reads = counting.made[-1]
    assert reads.asked > 0  # of 30 row groups (6 rows each: a read-ahead batch spans several)
    assert reads.most_held <= UNITS_AHEAD
    assert reads.held == 0  # every unit read ahead was taken
    # a state taken mid-run resumes to the same batches, whatever was read ahead then
    first = pipeline(parquet_data, tokenizer_dir, prefetch)
    head = take(first, 7)
    state = first.state_dict()
    resumed = pipeline(parquet_data, tokenizer_dir, prefetch)
    resumed.load_state_dict(state)
    assert digests(head) + digests(resumed) == reference


def test_the_reader_thread_ends_with_its_pipeline(parquet_data, tokenizer_dir, counting):
    first = pipeline(parquet_data, tokenizer_dir)
    take(first, 3)
    thread = counting.made.pop().thread  # held only by the pipeline now
    assert thread is not None and thread.is_alive()
    del first
    gc.collect()
    thread.join(30)
    assert not thread.is_alive()


def test_a_damaged_unit_read_ahead_fails_where_the_lane_takes_it(parquet_data, tokenizer_dir,
                                                                 counting):
    part = parquet_data / "b" / "part-1.parquet"
    data = bytearray(part.read_bytes())
    data[8:2000] = b"\x00" * 1992  # the first row groups' pages
    part.write_bytes(bytes(data))
    with pytest.raises(DataError) as ahead:
        digests(pipeline(parquet_data, tokenizer_dir))
    assert counting.made[-1].asked
    counting.units = 0
    with pytest.raises(DataError) as itself:
        digests(pipeline(parquet_data, tokenizer_dir))
    assert str(ahead.value) == str(itself.value)
    assert "part-1.parquet" in str(ahead.value)


def test_a_unit_dropped_before_it_is_begun_is_never_read():
    reads = UnitReads(units_ahead=2)
    gate, calls = threading.Event(), []
    first = reads.ask(lambda: gate.wait(30) and calls.append("first"))  # holds the thread
    second = reads.ask(lambda: calls.append("second"))
    assert reads.ask(lambda: calls.append("third")) is None  # both slots held
    second.drop()
    assert reads.held == 1
    gate.set()
    first.rows()
    assert reads.held == 0
    third = reads.ask(lambda: "rows")
    assert third is not None and third.rows() == "rows"
    assert calls == ["first"]
    reads.close()


def test_rows_are_read_by_the_taker_when_the_reader_thread_has_stopped():
    reads = UnitReads(units_ahead=2)
    reads.ask(lambda: None).rows()  # starts the thread
    thread = reads.thread
    reads.close()
    thread.join(10)
    assert not thread.is_alive()
    pending = reads.ask(lambda: "taken")  # a new thread, or read by the taker: either way
    assert pending.rows() == "taken" and reads.held == 0
    reads.close()
