"""What a pipeline leaves behind in a long-lived process: nothing it does not share."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import threading
import time
import weakref

from tests.conftest import write_jsonl
from zephon import Pipeline, background
from zephon.demo.assets import make_documents
from zephon.engine import document_threads
from zephon.io import Dataset
from zephon.ops.tokenize import DocumentTokenizer, TokenizeSpec
from zephon.work import StaticMixtureWorkSource


def test_dropping_a_pipeline_frees_its_work_source(tmp_path, tokenizer_dir):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(40)])
    refs = []
    for seed in range(3):
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=seed)
        refs.append(weakref.ref(source))
        pipeline = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2)
        for _, _batch in zip(range(2), pipeline, strict=False):
            pass
        del source, pipeline, _batch
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]


def test_pipelines_share_the_tokenizer_they_read(tokenizer_dir):
    def backend(split: bool):
        return DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir,
                                              split_special_tokens=split)).encoder._backend

    assert backend(True) is backend(True)
    assert backend(False) is backend(False) and backend(False) is not backend(True)
    assert backend(True).encode_special_tokens and not backend(False).encode_special_tokens


MANY_PIPELINES = textwrap.dedent("""
    import gc, json, sys
    import psutil
    from zephon import Pipeline, background
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    path, tokenizer, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rss = []
    for seed in range(count):
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)], seed=seed)
        pipeline = Pipeline(source).tokenize(tokenizer_id=tokenizer).pack_flat(129).batch(4)
        for _, batch in zip(range(3), pipeline):
            pass
        del source, pipeline, batch
        gc.collect()
        rss.append(psutil.Process().memory_info().rss)
    print(json.dumps(rss))
""")


def test_building_and_dropping_300_pipelines_keeps_memory_flat(tmp_path, tokenizer_dir):
    """An evaluation loop's pattern, in a fresh process: RSS may grow while the first
    pipelines warm up (the tokenizer, fastokens, allocator arenas), then stays flat."""
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(50)])
    run = subprocess.run([sys.executable, "-c", MANY_PIPELINES, str(path), tokenizer_dir,
                          "300"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rss = json.loads(run.stdout.strip().splitlines()[-1])
    grown = (rss[-1] - rss[19]) / 2**20
    assert grown < 30, f"RSS grew {grown:.1f} MiB over pipelines 20-300"


def test_document_threads_are_stopped_before_the_interpreter_exits():
    """At exit, batches no thread has started are cancelled and the running ones finish, so
    no thread is inside the Rust tokenizer when the interpreter tears down."""

    class Slow:
        def __init__(self):
            self.started = threading.Event()

        def run(self):
            self.started.set()
            time.sleep(0.2)
            return "done"

    threads = document_threads.DocumentThreads({0: []}, threads=2)
    before = set(threading.enumerate())
    threads._start()
    requests = threads._requests
    workers = set(threading.enumerate()) - before
    assert len(workers) == 2
    running = [document_threads._Batch((), [], []) for _ in range(6)]
    slows = [Slow() for _ in running]
    for batch, slow in zip(running, slows, strict=True):
        batch.run = slow.run  # type: ignore[method-assign]
        requests.put(batch)
    assert slows[0].started.wait(30)  # a thread runs the first batch (taken in order)
    assert background.stop_all(only=[threads._registration]) == []
    assert not any(w.is_alive() for w in workers)
    assert background.stop_all(only=[threads._registration]) == []  # forgotten once stopped
    done = [b for b in running if b.done() and not b.cancelled()]
    assert 1 <= len(done) <= 4 and any(b.cancelled() for b in running)


def test_threads_stopped_by_a_dropped_pipeline_are_still_waited_for_at_exit():
    """A pipeline dropped as the process exits (its loop left by SIGTERM) stops its document
    threads without waiting; the exit must still wait for the batch one is running (inside
    the tokenizer, the interpreter's end of the thread aborts the process: exit 134)."""
    import threading

    from zephon import background
    from zephon.engine import document_threads

    threads = document_threads.DocumentThreads({0: []}, threads=1)
    before = set(threading.enumerate())
    threads._start()
    [worker] = set(threading.enumerate()) - before
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(5)
        return "done"

    batch = document_threads._Batch((), [], [])
    batch.run = slow  # type: ignore[method-assign]
    threads._requests.put(batch)
    assert started.wait(5)
    registration = threads._registration
    threads.close()  # what dropping the pipeline does: stop, do not wait
    assert worker.is_alive()
    threading.Timer(0.3, release.set).start()
    assert background.stop_all(only=[registration]) == []  # the exit's wait
    assert not worker.is_alive()


def test_an_iterator_closed_on_another_thread_does_not_wait_for_its_producer(
        tmp_path, tokenizer_dir, monkeypatch):
    """A dropped iterator is finalized by whichever thread collects it, possibly a document
    thread its producer waits for: only the consumer's thread joins the producer. Here the
    producer is held inside a microbatch until the closing thread has returned; a close that
    joined it would wait its full timeout (30 s)."""
    from zephon.engine.lane import Lane

    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(200)])
    gate, held = threading.Event(), threading.Event()
    real = Lane.next_microbatch

    def next_microbatch(self):
        if threading.current_thread().name == "zephon-rank0" and self.microbatches >= 3:
            held.set()
            gate.wait()
        return real(self)

    monkeypatch.setattr(Lane, "next_microbatch", next_microbatch)
    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", path)]))
                .options(lanes=1, prefetch=2).tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(33).batch(1))
    iterator = iter(pipeline)
    next(iterator)
    assert held.wait(30)
    producer = next(t for t in threading.enumerate() if t.name == "zephon-rank0")
    took: list[float] = []

    def close_here() -> None:
        start = time.monotonic()
        iterator.close()
        took.append(time.monotonic() - start)

    closer = threading.Thread(target=close_here)
    closer.start()
    closer.join(10)
    assert took and took[0] < 5, "the closing thread waited for the producer"
    gate.set()
    producer.join(10)
    assert not producer.is_alive()  # the stop it was given ends it once it is let go
