"""The pipeline report lists every dataset and everything skipped."""

from __future__ import annotations

from tests.conftest import write_jsonl
from zephon import Pipeline
from zephon.io import Dataset
from zephon.report import sum_stats
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def test_zero_weight_datasets_and_skipped_files_are_listed(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "a" / "a.jsonl", [{"text": f"alpha {i}"} for i in range(20)])
    (tmp_path / "a" / "README.txt").write_text("not data")
    write_jsonl(tmp_path / "b" / "b.jsonl", [{"text": "beta"}])
    source = StaticMixtureWorkSource(
        [Dataset.from_path("a", tmp_path / "a"), Dataset.from_path("b", tmp_path / "b")],
        MixtureSpec({"a": 1.0, "b": 0.0}))
    pipeline = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).batch(4)
    list(pipeline)
    report = pipeline.report()
    assert [(d.name, d.target_share, d.documents) for d in report.datasets] == [
        ("a", 1.0, 20), ("b", 0.0, 0)]
    assert [s.rsplit("/", 1)[-1] for s in report.datasets[0].skipped_files] == [
        "README.txt (not a data file)"]
    text = str(report)
    assert "skipped files:" in text and "README.txt" in text
    assert "\nb " in text


def test_stats_sum_nested_counts():
    assert sum_stats([{"a": 1, "d": {"x": 2}}, {"a": 3, "d": {"x": 1, "y": 4}}, {}]) == {
        "a": 4, "d": {"x": 3, "y": 4}}


def test_rows_a_lane_holds_when_the_rounds_end_are_handed_out(tmp_path):
    # 11 rows dealt over two lanes leave one lane a batch ahead of the other when the rounds
    # end: one rank hands that batch out in the last round, and two ranks that cannot agree
    # (no process group) each run their own lanes out. Every row is handed or dropped.
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"x": i} for i in range(7)])
    write_jsonl(tmp_path / "d" / "b.jsonl", [{"x": i} for i in range(7, 11)])
    source = StaticMixtureWorkSource([Dataset.from_path("d", tmp_path / "d")],
                                     on_exhausted="drain")
    one = Pipeline(source).options(lanes=2).batch(2)
    batches = list(one)
    assert [b.position is not None for b in batches][-1]  # the last came from the last round
    assert one.report().leftover["rows"] == 0
    assert sum(len(b) for b in batches) + one.report().dropped["rows"] == 11
    ranks = [Pipeline(source).options(lanes=2, dp_rank=r, dp_world_size=2).batch(2)
             for r in range(2)]
    handed = sum(len(b) for rank in ranks for b in rank)
    assert handed + sum(rank.report().dropped["rows"] for rank in ranks) == 11


def test_the_report_tells_what_was_handed_from_what_was_read(two_datasets, tokenizer_dir):
    """Shares, padding and handed counts are of the microbatches the trainer took; read counts
    include what waits in open rows and the shuffle buffer."""
    import itertools

    def pipeline() -> Pipeline:
        datasets = [Dataset.from_path(n, p) for n, p in two_datasets.items()]
        source = StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(two_datasets, 1.0)),
                                         seed=3)
        return (Pipeline(source).options(lanes=2, prefetch=2)
                .tokenize(tokenizer_id=tokenizer_dir, max_document_tokens=40)
                .pack_flat(65, "best_fit").shuffle(16).batch(2))

    first = pipeline()
    taken = list(itertools.islice(first, 7))
    tokens: dict[str, int] = {}
    documents: dict[str, int] = {}
    for span in (s for b in taken for r in b.records for s in r.meta["documents"]):
        tokens[span.dataset] = tokens.get(span.dataset, 0) + span.length
        documents[span.dataset] = documents.get(span.dataset, 0) + (span.doc_start == 0)
    report = first.report()
    by_name = {d.name: d for d in report.datasets}
    assert {n: d.handed_tokens for n, d in by_name.items()} == tokens
    assert {n: d.handed_documents for n, d in by_name.items()} == documents
    assert all(d.tokens > d.handed_tokens for d in report.datasets)  # buffers hold the rest
    unit = tokens if report.mix_by == "tokens" else documents
    total = sum(unit.values())
    assert all(abs(d.realized_share - unit[d.name] / total) < 1e-12 for d in report.datasets)
    assert report.padding_tokens == sum(r.meta["padding"] for b in taken for r in b.records)
    assert "handed to the trainer" in str(report)

    resumed = pipeline()
    resumed.load_state_dict(first.state_dict())
    more = list(itertools.islice(resumed, 3))
    for span in (s for b in more for r in b.records for s in r.meta["documents"]):
        tokens[span.dataset] += span.length
    assert {d.name: d.handed_tokens for d in resumed.report().datasets} == tokens


def test_a_ranks_report_says_it_covers_its_lanes_only(two_datasets, tokenizer_dir):
    datasets = [Dataset.from_path(n, p) for n, p in two_datasets.items()]
    source = StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(two_datasets, 1.0)))
    rank = (Pipeline(source).options(lanes=4, dp_rank=1, dp_world_size=2, prefetch=0)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))
    next(iter(rank))
    report = rank.report()
    assert (report.lanes, report.total_lanes) == ((1, 3), 4)
    assert str(report).startswith("this rank's lanes only: 1, 3 of 4")
    whole = (Pipeline(source).options(lanes=4, prefetch=0).tokenize(tokenizer_id=tokenizer_dir)
             .pack_flat(65).batch(2))
    next(iter(whole))
    assert "lanes only" not in str(whole.report())
