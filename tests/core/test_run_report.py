"""The kit's end-of-run report and the session's restart at the end of the data: printed once,
by global rank 0 only, summed over readers where they end together, and at exit for a run
stopped early; the data started over in the same order, and empty data refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import write_jsonl
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.errors import DataError
from zephon.integration import EndOfRunReport, LoaderSession
from zephon.integration.run_report import merge_reports
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource


@pytest.fixture
def data(tmp_path):
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": t} for t in make_documents(60, seed=4)])
    return tmp_path / "d"


def pipeline(data, tokenizer_dir, rank: int = 0, world: int = 1) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("d", str(data))])
    return (Pipeline(source).options(lanes=2, dp_rank=rank, dp_world_size=world, prefetch=0)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(33).batch(2))


def test_the_report_is_printed_once_by_global_rank_0_only(data, tokenizer_dir, monkeypatch):
    said: list[str] = []
    session = LoaderSession(pipeline(data, tokenizer_dir), {"return_labels": True})
    report = EndOfRunReport(session.meter, session.pipeline, rows=2, row_tokens=33,
                            say=said.append)
    assert not report.print("last step")  # nothing handed out yet: nothing to report
    for _ in zip(range(3), session, strict=False):
        pass
    # the global rank as the kit reads it (torch.distributed's, else RANK)
    monkeypatch.setattr("zephon.integration.run_report.global_rank", lambda: 1)
    assert not report.print("last step") and said == []  # rank 1 never prints...
    monkeypatch.setattr("zephon.integration.run_report.global_rank", lambda: 0)
    assert not report.print("last step") and said == []  # ...and the run counts as reported
    fresh = EndOfRunReport(session.meter, session.pipeline, rows=2, row_tokens=33,
                           say=said.append)
    assert fresh.print("last step") and not fresh.print("at exit")
    assert len(said) == 1
    assert said[0].startswith("zephon: end of run (last step): 3 microbatches, 6 rows of 33 "
                              "tokens = 198 tokens")
    assert "handed to the trainer" in said[0]
    assert not EndOfRunReport(session.meter, session.pipeline, due=False).print("x")


def test_two_readers_reports_merge_into_the_jobs(data, tokenizer_dir):
    whole = pipeline(data, tokenizer_dir)
    it = iter(whole)
    for _ in range(8):
        next(it)
    ranks = [pipeline(data, tokenizer_dir, r, 2) for r in range(2)]
    iterators = [iter(p) for p in ranks]
    for _ in range(4):
        for i in iterators:
            next(i)
    merged = merge_reports([p.report() for p in ranks])
    one = whole.report()
    assert merged.lanes == (0, 1) and merged.microbatches == one.microbatches == 8
    [mine], [theirs] = merged.datasets, one.datasets
    assert (mine.handed_tokens, mine.handed_documents) == (theirs.handed_tokens,
                                                           theirs.handed_documents)
    assert mine.realized_share == pytest.approx(1.0)
    assert merged.padding_tokens == one.padding_tokens
    assert "this rank's lanes only" in str(ranks[0].report())
    assert "this rank's lanes only" not in str(merged)


def test_a_run_stopped_early_is_reported_at_exit(data, tokenizer_dir):
    script = textwrap.dedent(f"""
        from zephon import Pipeline
        from zephon.integration import EndOfRunReport, LoaderSession
        from zephon.io import Dataset
        from zephon.work import StaticMixtureWorkSource

        class Loader:  # what an adapter holds
            pass

        source = StaticMixtureWorkSource([Dataset.from_path("d", {str(data)!r})])
        p = (Pipeline(source).options(lanes=2, prefetch=2)
             .tokenize(tokenizer_id={tokenizer_dir!r}).pack_flat(33).batch(2))
        loader = Loader()
        loader.session = LoaderSession(p, {{}})
        loader.report = EndOfRunReport(loader.session.meter, p, rows=2, row_tokens=33)
        loader.report.at_exit(loader)
        for _ in zip(range(2), loader.session):
            pass
        raise KeyboardInterrupt
        """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "RANK": "0"})
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    assert result.stdout.count("zephon: end of run") == 1
    assert "zephon: end of run (at exit): 2 microbatches" in result.stdout


def test_cycling_starts_the_data_over_in_the_same_order(data, tokenizer_dir):
    session = LoaderSession(pipeline(data, tokenizer_dir), {})
    one_pass = [out["input_ids"].tolist() for out in session]
    said: list[str] = []
    cycled = session.batches(cycle=True, said=said.append)
    again = [out["input_ids"].tolist() for _, (_, out) in zip(range(2 * len(one_pass) + 1),
                                                               cycled, strict=False)]
    assert again == one_pass + one_pass + one_pass[:1]
    assert said == [f"zephon: end of data after {len(one_pass)} microbatches on this rank; "
                    "starting over"] * 2


def test_cycling_data_that_yields_nothing_is_an_error_not_a_loop(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": "too short"}])
    session = LoaderSession(pipeline(tmp_path / "d", tokenizer_dir), {})
    with pytest.raises(DataError, match="no microbatch could be made"):
        next(session.batches(cycle=True))


def test_the_exit_hook_keeps_no_dropped_loader_alive(data, tokenizer_dir):
    """The exit hook holds the loader and its report weakly: a dropped loader frees its
    pipeline (its worker processes and shared memory with it) at once, not at exit."""
    import gc
    import weakref

    class Loader:  # what an adapter holds
        pass

    loader = Loader()
    loader.pipeline = pipeline(data, tokenizer_dir)
    loader.session = LoaderSession(loader.pipeline, {})
    loader.report = EndOfRunReport(loader.session.meter, loader.pipeline)
    loader.report.at_exit(loader)
    next(iter(loader.session))
    gone = weakref.ref(loader.pipeline)
    del loader
    gc.collect()
    assert gone() is None
