"""Shared fixtures: the deterministic demo tokenizer and small corpora written per test."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.demo.assets import build_demo_assets, make_documents

SLOW_TEST_S = 20.0
"""About what a test marked ``slow`` or ``multiprocess`` takes on 2 cores (a trainer launched,
processes started): 10 to 50 s."""
OTHER_TEST_S = 0.3
"""About what any other test takes."""


def pytest_collection_modifyitems(config, items) -> None:
    """Longest test modules first, so that the pytest-xdist process that finishes last is
    not left running one long module alone while the other waits (the Makefile passes
    ``--no-loadscope-reorder``, which keeps this order; xdist's own reordering puts modules
    with many tests first, which put the few long trainer modules last and left one core idle
    for minutes at the end). A module's length is estimated from its tests' markers
    (:data:`SLOW_TEST_S`, :data:`OTHER_TEST_S`); the order within a module is kept."""
    cost: dict[str, float] = {}
    for test in items:
        heavy = test.get_closest_marker("slow") or test.get_closest_marker("multiprocess")
        scope = test.nodeid.rsplit("::", 1)[0]
        cost[scope] = cost.get(scope, 0.0) + (SLOW_TEST_S if heavy else OTHER_TEST_S)
    items.sort(key=lambda test: -cost[test.nodeid.rsplit("::", 1)[0]])


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory) -> dict[str, str]:
    """The embedded demo corpus and BPE tokenizer (built once per test session)."""
    return build_demo_assets(tmp_path_factory.mktemp("demo"), n_docs=600, n_files=3)


@pytest.fixture(scope="session")
def tokenizer_dir(demo_assets) -> str:
    return demo_assets["tokenizer"]


def write_parquet(path: Path, texts: list[str], row_group_size: int = 16,
                  extra: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {"text": texts, "idx": list(range(len(texts)))}
    columns.update(extra or {})
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def two_datasets(tmp_path) -> dict[str, Path]:
    """A short-document Parquet dataset (3 files, odd row groups) and a long-document JSONL one;
    mean document lengths differ about 5x."""
    short = make_documents(150, seed=1, min_words=10, max_words=50)
    long = make_documents(60, seed=2, min_words=100, max_words=200)
    root = tmp_path / "data"
    for i in range(3):
        write_parquet(root / "short" / f"part-{i}.parquet", short[i * 50:(i + 1) * 50],
                      row_group_size=7)
    for i in range(2):
        write_jsonl(root / "long" / f"part-{i}.jsonl",
                    [{"text": t, "n": j} for j, t in enumerate(long[i * 30:(i + 1) * 30])])
    return {"short": root / "short", "long": root / "long"}


@contextlib.contextmanager
def sigint_default_in_children() -> Iterator[None]:
    """Processes started inside get SIGINT's default action, so that their Python raises
    KeyboardInterrupt on it, even when this process was started with SIGINT ignored (a
    background job of a non-interactive shell is: an ignored signal stays ignored across exec,
    and Python then installs no KeyboardInterrupt handler). Main thread only."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def killed_after(process, seconds: float, kill=None) -> Iterator[None]:
    """Kill ``process`` (a Popen; ``kill()`` when given) if the block runs longer than
    ``seconds``: a test that reads a child's output line by line fails instead of hanging when
    the child does not stop."""
    import threading

    timer = threading.Timer(seconds, kill or process.kill)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.fixture
def read_counts(tmp_path, monkeypatch):
    """Count each recipe read and dataset listing of every process a test starts: returns a
    function giving ``{pid: Counter of lines}`` (see ``tests/read_counter``)."""
    import collections
    import os

    directory = tmp_path / "read-counts"
    directory.mkdir()
    counter = Path(__file__).with_name("read_counter")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(counter), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("ZEPHON_TEST_READ_COUNTS", str(directory))

    def counts() -> dict[str, collections.Counter]:
        return {path.stem: collections.Counter(path.read_text().splitlines())
                for path in directory.glob("*.log")}

    return counts
