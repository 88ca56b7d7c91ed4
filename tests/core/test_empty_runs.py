"""No silent empty runs and no busy loops: a run that would deliver no batch, and a repeated
dataset that yields no document, are errors that say why."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import write_jsonl, write_parquet
from zephon import Pipeline
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def first_batches(pipeline: Pipeline, n: int, wait_s: float = 120.0) -> list | BaseException:
    """Up to ``n`` batches of ``pipeline``, or the exception iterating it raised. Runs in a
    daemon thread so that a pipeline that loops forever fails the test (no result) instead of
    hanging the session."""
    outcome: list = []

    def run() -> None:
        try:
            batches = []
            for batch in pipeline:
                batches.append(batch)
                if len(batches) == n:
                    break
            outcome.append(batches)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert outcome, "iterating the pipeline neither delivered batches nor raised"
    return outcome[0]


def texts(n: int, prefix: str = "text") -> list[str]:
    return [f"{prefix} number {i} with some words" for i in range(n)]


# -- mixture weights --------------------------------------------------------------------------
def test_huge_weights_are_normalized_without_overflow(tmp_path):
    mixture = MixtureSpec({"a": 1e308, "b": 1e308})
    assert mixture.as_dict() == {"a": 0.5, "b": 0.5}
    assert MixtureSpec({"a": 3e307, "b": 1e308}).as_dict()["a"] == pytest.approx(0.3 / 1.3)
    paths = {n: write_parquet(tmp_path / f"{n}.parquet", texts(20, n)) for n in "ab"}
    source = StaticMixtureWorkSource([Dataset.from_path(n, p) for n, p in paths.items()],
                                     mixture, on_exhausted="drain")
    batches = list(Pipeline(source).batch(4))
    assert len(batches) == 10
    assert {r.meta["dataset"] for b in batches for r in b.records} == {"a", "b"}


def test_a_positive_weight_whose_share_rounds_to_zero_is_an_error():
    with pytest.raises(ConfigError, match=r"weight of 'tiny' \(1e-300\) is positive, but its "
                                          r"share of the total rounds to 0"):
        MixtureSpec({"big": 1e308, "tiny": 1e-300})
    assert MixtureSpec({"big": 1e308, "off": 0}).as_dict() == {"big": 1.0, "off": 0.0}


# -- runs that deliver no batch -----------------------------------------------------------------
def test_a_filter_that_drops_everything_is_an_error_saying_so(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", texts(30))
    source = StaticMixtureWorkSource([Dataset.from_path("web", path)])
    pipeline = Pipeline(source).filter(lambda doc: False).batch(2, drop_last=False)
    with pytest.raises(DataError, match=r"no microbatch could be made: 30 row\(s\) were read "
                                        r"and every one was dropped.*'web': 30 row\(s\) read, 0 "
                                        r"document\(s\) delivered, dropped filtered:.*: 30"):
        list(pipeline)
    report = pipeline.report()
    assert report.finished and report.datasets[0].filtered == 30  # the counts it names
    with pytest.raises(DataError, match="no microbatch could be made"):
        list(pipeline)  # iterating again says so again
    pipeline.reset()
    with pytest.raises(DataError, match="no microbatch could be made"):
        next(iter(pipeline))


def test_fewer_documents_than_a_microbatch_with_drop_last_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts(3)])
    source = StaticMixtureWorkSource([Dataset.from_path("small", path)])
    pipeline = Pipeline(source).batch(8, drop_last=True)
    with pytest.raises(DataError, match=r"3 document\(s\) .*made only 3 row\(s\), fewer than "
                                        r"one microbatch, which batch\(drop_last=True\) "
                                        r"dropped"):
        list(pipeline)
    assert pipeline.report().dropped["rows"] == 3
    assert len(list(Pipeline(source).batch(8, drop_last=False))) == 1


def test_a_lane_without_a_microbatch_leaves_the_others_to_the_last_round(tmp_path):
    """Four lanes over twelve one-row units, not shuffled: lane l reads rows l, l + 4, l + 8.
    Lane 1's rows are all filtered, so no round is complete; the last round hands out the
    other lanes' nine microbatches, turn by turn in lane order."""
    rows = ["skip me" if i % 4 == 1 else f"text {i}" for i in range(12)]
    path = write_parquet(tmp_path / "d.parquet", rows)
    source = StaticMixtureWorkSource([Dataset.from_path("web", path)], shuffle_units=False)
    pipeline = (Pipeline(source).options(lanes=4).filter(lambda d: d["text"] != "skip me")
                .batch(1, drop_last=False))
    out = list(pipeline)
    assert [b.lane for b in out] == [0, 2, 3] * 3
    assert [b.position for b in out] == list(range(9))
    assert pipeline.report().leftover["microbatches"] == 0


# -- repeated datasets without documents --------------------------------------------------------
def test_a_repeated_dataset_whose_rows_are_all_filtered_is_an_error(tmp_path):
    rows = ["dead"] * 60 + ["alive"] * 4  # 16 units of 4 rows, one of them alive
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=4)
    source = StaticMixtureWorkSource([Dataset.from_path("web", path)], repeat=True, seed=4)
    pipeline = Pipeline(source).options(lanes=4)
    # A lane's pass may come up empty while another unit holds documents: no error.
    outcome = first_batches(pipeline.filter(lambda d: d["text"] == "alive").batch(1), 8)
    assert not isinstance(outcome, BaseException), outcome
    assert [r.payload["text"] for b in outcome for r in b.records] == ["alive"] * 8
    outcome = first_batches(pipeline.filter(lambda d: d["text"] == "none").batch(1), 1)
    assert isinstance(outcome, DataError), outcome
    assert str(outcome).startswith(
        "dataset 'web' is repeated, so it would be read forever, but a whole pass over its 16 "
        "work unit(s) read 64 row(s) and yielded no document; dropped 64 (filtered:")


def test_a_repeated_dataset_of_empty_texts_is_an_error(tmp_path, tokenizer_dir):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": ""} for _ in range(12)])
    source = StaticMixtureWorkSource([Dataset.from_path("web", path)], repeat=True,
                                     unit_bytes=64)
    pipeline = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(16).batch(1)
    outcome = first_batches(pipeline, 1)
    assert isinstance(outcome, DataError), outcome
    assert "read 12 row(s) and yielded no document; dropped 12 (empty: 12)" in str(outcome)


def test_a_repeated_dataset_without_rows_is_an_error(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n" * 40)
    source = StaticMixtureWorkSource([Dataset.from_path("blank", path)], repeat=True,
                                     unit_bytes=8)
    outcome = first_batches(Pipeline(source).options(lanes=2).batch(1), 1)
    assert isinstance(outcome, DataError), outcome
    assert "holds no rows" in str(outcome)


def test_a_lane_whose_own_units_are_all_dropped_is_an_error(tmp_path):
    """Units not shuffled: with 2 lanes and 8 units, lane 1 is only ever given the odd units.
    If those hold no document the lane would loop forever although lane 0 has documents."""
    rows = [t for g in range(8) for t in (["even"] * 4 if g % 2 == 0 else ["odd"] * 4)]
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=4)
    source = StaticMixtureWorkSource([Dataset.from_path("web", path)], repeat=True,
                                     shuffle_units=False)
    pipeline = (Pipeline(source).options(lanes=2).filter(lambda d: d["text"] == "even")
                .batch(1))
    outcome = first_batches(pipeline, 5)
    assert isinstance(outcome, DataError), outcome
    assert ("lane 1 of 2 is only ever given 4 of its 8 work units (units are not shuffled), "
            "and a whole pass over them read 16 row(s) and yielded no document") in str(outcome)
