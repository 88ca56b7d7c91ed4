"""The document threads: operators read ahead on threads of their own, same data and state."""

from __future__ import annotations

import gc
import os
import threading
from functools import partial

import pytest

from tests.conftest import write_jsonl
from tests.kit.batches import batch_ids, equal_weights_source
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.engine import dataset_source as source_module
from zephon.engine import document_threads
from zephon.engine.document_threads import DocumentThreads, threads_for_this_rank
from zephon.engine.workers import DocumentWorkers
from zephon.errors import DataError
from zephon.ops.base import DocumentOperator
from zephon.records import Doc

source_for = partial(equal_weights_source, seed=5, on_exhausted="drain")

THREAD = document_threads.THREAD_NAME


def pipeline(paths: dict, tokenizer_dir: str, prefetch: int, seen: list | None = None
             ) -> Pipeline:
    def note_thread(row: dict) -> dict:
        if seen is not None:
            seen.append(threading.current_thread().name)
        return row

    return (Pipeline(source_for(paths)).options(lanes=3, prefetch=prefetch)
            .map(note_thread).tokenize(tokenizer_id=tokenizer_dir, max_document_tokens=40,
                                        engine="hf")
            .pack_flat(65).shuffle(8).batch(2))


def live_document_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == THREAD and t.is_alive()}


@pytest.mark.parametrize("count", [1, 2])
def test_the_threads_run_the_operators_and_change_no_batch_and_no_state(
        two_datasets, tokenizer_dir, monkeypatch, count) -> None:
    monkeypatch.setattr(source_module, "CHUNK_CHARS", 2000)  # many batches per unit
    monkeypatch.setattr(document_threads, "threads_for_this_rank", lambda: count)
    seen_sync: list[str] = []
    reference = pipeline(two_datasets, tokenizer_dir, 0, seen_sync)
    straight = batch_ids(reference)
    assert len(straight) > 30
    assert THREAD not in seen_sync, "prefetch=0 runs everything on the caller's thread"
    seen: list[str] = []
    threaded = pipeline(two_datasets, tokenizer_dir, 4, seen)
    it = iter(threaded)
    head = batch_ids(next(it) for _ in range(11))
    state = threaded.state_dict()
    assert head == straight[:11]
    # the threads ran batches ahead; the producer took back only ones they had not started
    assert THREAD in seen and set(seen) <= {THREAD, "zephon-rank0"}
    assert batch_ids(it) == straight[11:]
    assert str(threaded.report()) == str(reference.report())
    # the state taken with batches in flight resumes exactly, with or without the thread
    for prefetch in (0, 4):
        resumed = pipeline(two_datasets, tokenizer_dir, prefetch)
        resumed.load_state_dict(state)
        assert batch_ids(resumed) == straight[11:], f"resume with prefetch={prefetch}"
    sync_state = pipeline(two_datasets, tokenizer_dir, 0)
    it = iter(sync_state)
    for _ in range(17):
        next(it)
    resumed = pipeline(two_datasets, tokenizer_dir, 4)
    resumed.load_state_dict(sync_state.state_dict())
    assert batch_ids(resumed) == straight[17:]


def test_two_threads_where_the_rank_has_two_cores_to_itself(monkeypatch) -> None:
    def rank_with(cores: int, local_ranks: str | None) -> int:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)),
                            raising=False)
        if local_ranks is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
        return threads_for_this_rank()

    assert rank_with(2, None) == 2
    assert rank_with(1, None) == 1
    assert rank_with(2, "2") == 1  # two ranks sharing two cores
    assert rank_with(16, "8") == 2
    assert rank_with(12, "8") == 1
    assert rank_with(4, "junk") == 2
    assert DocumentThreads({}, threads=2).in_flight == 3


def test_only_datasets_with_a_gil_releasing_operator_use_the_threads(
        tmp_path, tokenizer_dir, monkeypatch) -> None:
    """A tokenized dataset's batches go to the threads; a pretokenized one's (Python-bound
    checks) stay on the producer thread. Batches and resume are those of prefetch=0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.text.tokenizer import load_tokenizer

    monkeypatch.setattr(source_module, "CHUNK_CHARS", 2000)
    texts = make_documents(120, seed=4, min_words=10, max_words=60)
    write_jsonl(tmp_path / "text" / "part.jsonl", [{"text": t} for t in texts[:60]])
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[60:]]
    (tmp_path / "ids").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))}),
                   tmp_path / "ids" / "part.parquet", row_group_size=8)

    def run(prefetch: int, seen: dict | None = None) -> Pipeline:
        def note_thread(row: dict) -> dict:
            if seen is not None:
                kind = "text" if "text" in row else "ids"
                seen.setdefault(kind, set()).add(threading.current_thread().name)
            return row

        return (Pipeline(source_for({"text": tmp_path / "text", "ids": tmp_path / "ids"}))
                .options(lanes=2, prefetch=prefetch).map(note_thread)
                .tokenize(tokenizer_id=tokenizer_dir, datasets=("text",), engine="hf")
                .pretokenized(eos_token_id=tokenizer.eos_token_id, datasets=("ids",))
                .pack_flat(33).batch(2))

    straight = batch_ids(run(0))
    assert len(straight) > 20
    seen: dict = {}
    threaded = run(4, seen)
    it = iter(threaded)
    assert batch_ids(next(it) for _ in range(9)) == straight[:9]
    state = threaded.state_dict()
    assert batch_ids(it) == straight[9:]
    assert THREAD in seen["text"]
    assert seen["ids"] == {"zephon-rank0"}, "no document thread for Python-bound operators"
    resumed = run(4)
    resumed.load_state_dict(state)
    assert batch_ids(resumed) == straight[9:]


def test_which_offload_takes_which_operators() -> None:
    class Native(DocumentOperator):
        releases_gil = True

        def apply(self, docs, where):
            return [[d] for d in docs]

    class Python(Native):
        releases_gil = False

    native, python = Native(None), Python(None)
    assert DocumentThreads.takes([python, native])
    assert not DocumentThreads.takes([python]) and not DocumentThreads.takes([])
    assert DocumentWorkers.takes([python]) and not DocumentWorkers.takes([])


class _Gate(DocumentOperator):
    """Holds each batch starting with one of ``held`` inside ``apply`` until released;
    records the documents it was given and the thread of each."""

    def __init__(self, held: tuple[str, ...] = ("a",)) -> None:
        self.held = held
        self.entered, self.release = threading.Semaphore(0), threading.Event()
        self.applied: list[str] = []
        self.threads: dict[str, str] = {}

    def apply(self, docs, where):
        if docs[0].doc_id in self.held:
            self.entered.release()
            assert self.release.wait(10)
        self.applied += [d.doc_id for d in docs]
        self.threads.update((d.doc_id, threading.current_thread().name) for d in docs)
        return [[d] for d in docs]

    def wait_until_held(self) -> None:
        """Until every thread holds a batch: then nothing else starts until release."""
        for _ in self.held:
            assert self.entered.acquire(timeout=10)


def docs(*ids: str) -> list[Doc]:
    return [Doc(None, i, "d", fields={"text": i}) for i in ids]


@pytest.mark.parametrize("count", [1, 2])
def test_batches_come_back_in_order_and_a_discarded_one_never_runs(count) -> None:
    gate = _Gate(held=("a", "b")[:count])
    threads = DocumentThreads({0: [gate]}, threads=count)
    busy = [threads.submit(0, docs(i), ["x"]) for i in gate.held]
    gate.wait_until_held()
    discarded = threads.submit(0, docs("c"), ["z"])
    wanted = threads.submit(0, docs("d", "e"), ["w", "v"])
    threads.discard(discarded)  # queued behind the running batches: it is dropped unrun
    gate.release.set()
    for future, held in zip(busy, gate.held, strict=True):
        assert [d.doc_id for row, _ in threads.result(future) for d in row] == [held]
    assert [d.doc_id for row, _ in threads.result(wanted) for d in row] == ["d", "e"]
    assert discarded.cancelled() and sorted(gate.applied) == [*gate.held, "d", "e"]
    threads.close()


@pytest.mark.parametrize("count", [1, 2])
def test_a_batch_not_started_when_asked_for_runs_on_the_asking_thread(count) -> None:
    gate = _Gate(held=("a", "b")[:count])
    threads = DocumentThreads({0: [gate]}, threads=count)
    busy = [threads.submit(0, docs(i), ["x"]) for i in gate.held]  # other sources' read-ahead
    gate.wait_until_held()
    needed = threads.submit(0, docs("n"), ["y"])
    rows = threads.result(needed)  # does not wait for the busy batches
    assert [d.doc_id for row, _ in rows for d in row] == ["n"]
    assert gate.threads == {"n": threading.current_thread().name}
    assert not any(future.done() for future in busy)
    gate.release.set()
    for future, held in zip(busy, gate.held, strict=True):
        assert [d.doc_id for row, _ in threads.result(future) for d in row] == [held]
        assert gate.threads[held] == THREAD
    threads.close()


def test_an_error_on_the_thread_reaches_the_caller_naming_the_line(tmp_path,
                                                                   tokenizer_dir) -> None:
    rows = [{"text": t} for t in make_documents(40, seed=2)] + [{"text": 7}]
    write_jsonl(tmp_path / "d" / "bad.jsonl", rows)
    messages = []
    for prefetch in (0, 4):
        run = (Pipeline(source_for({"d": tmp_path / "d"})).options(prefetch=prefetch)
               .tokenize(tokenizer_id=tokenizer_dir, engine="hf").pack_flat(65)
               .batch(2, drop_last=False))
        with pytest.raises(DataError) as caught:
            list(run)
        messages.append(str(caught.value))
    assert "bad.jsonl:41: field 'text' is int" in messages[1]
    assert messages[0] == messages[1]


def test_the_threads_stop_with_their_pipeline(two_datasets, tokenizer_dir) -> None:
    before = live_document_threads()
    run = pipeline(two_datasets, tokenizer_dir, 4)
    it = iter(run)
    next(it)
    started = live_document_threads() - before
    # the same threads for the whole pipeline, however many sources (3 lanes x 2 here)
    assert len(started) == threads_for_this_rank()
    del it, run
    gc.collect()
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_threads() -> None:
    gate = _Gate()
    gate.release.set()
    threads = DocumentThreads({0: [gate]})
    assert threads.result(threads.submit(0, docs("a"), ["x"]))
    pid = os.fork()
    if pid == 0:  # the parent's threads do not exist here
        try:
            rows = threads.result(threads.submit(0, docs("b"), ["y"]))
            os._exit(0 if rows[0][0][0].doc_id == "b" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    threads.close()
