"""options(workers=N): document operators in worker processes give the same data and state."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import types
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_jsonl
from tests.core import toy_ops
from tests.kit.batches import batch_ids, equal_weights_source
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.engine.workers import DocumentWorkers, _transform, _unpack, block_prefix
from zephon.errors import ConfigError
from zephon.records import Doc

source_for = partial(equal_weights_source, on_exhausted="drain")


def pipeline(paths: dict, tokenizer_dir: str, workers: int) -> Pipeline:
    return (Pipeline(source_for(paths)).options(lanes=2, workers=workers)
            .filter(toy_ops.keep_even_length).tokenize(tokenizer_id=tokenizer_dir,
                                                 max_document_tokens=40)
            .pack_flat(65).shuffle(8).batch(2))


def test_every_worker_count_gives_the_same_batches_and_resumes_the_same(
        two_datasets, tokenizer_dir) -> None:
    reference = pipeline(two_datasets, tokenizer_dir, 0)
    straight = batch_ids(reference)
    assert len(straight) > 20
    for workers in (1, 2):
        run = pipeline(two_datasets, tokenizer_dir, workers)
        it = iter(run)
        head = batch_ids(next(it) for _ in range(7))
        state = run.state_dict()
        assert head == straight[:7], f"workers={workers}"
        resumed = pipeline(two_datasets, tokenizer_dir, 0 if workers == 2 else 2)
        resumed.load_state_dict(state)
        assert batch_ids(resumed) == straight[7:], f"resume of workers={workers}"
        assert str(resumed.report()) == str(reference.report())  # counts, drops, filtered
        rest = batch_ids(it)
        assert rest == straight[7:], f"workers={workers} after a state_dict"
        assert str(run.report()) == str(reference.report())


def test_results_come_back_through_shared_memory_not_pickled(tokenizer_dir) -> None:
    from zephon.engine import workers as module
    from zephon.ops.base import BuildContext
    from zephon.ops.tokenize import TokenizeSpec

    op = TokenizeSpec(tokenizer_id=tokenizer_dir).build(BuildContext(seed=0, lanes=1))
    module._OPS[0] = (op,)
    texts = make_documents(30, seed=4, min_words=200, max_words=300)
    docs = [Doc(None, f"d{i}", "d", fields={"text": t}) for i, t in enumerate(texts)]
    shipped = _transform(0, docs, [f"row {i}" for i in range(len(docs))])
    skeleton, name, sizes = shipped
    token_bytes = sum(int(d.tokens.nbytes) for row, _ in _unpack(
        _transform(0, docs, ["x"] * len(docs))) for d in row)
    assert name is not None and sum(sizes) >= token_bytes
    assert len(skeleton) < token_bytes / 4, "token arrays travelled inside the pickle"
    rows = _unpack(shipped)
    assert [len(r) for r, _ in rows] == [1] * len(texts)
    assert all(isinstance(d.tokens, np.ndarray) and d.tokens.dtype == np.int32
               for r, _ in rows for d in r)


def test_operators_that_cannot_reach_a_worker_are_named(tmp_path, tokenizer_dir) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_documents(5, seed=1)])
    local = Pipeline(source_for({"d": tmp_path / "d.jsonl"})).options(workers=1).filter(
        lambda doc: True).tokenize(tokenizer_id=tokenizer_dir).pack_flat(33).batch(1)
    with pytest.raises(ConfigError, match=r"filter.*cannot be sent.*workers=0"):
        iter(local)


def test_workers_must_not_be_negative(tmp_path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"text": "ka"}])
    with pytest.raises(ConfigError, match="workers must be an integer >= 0"):
        Pipeline(source_for({"d": tmp_path / "d.jsonl"})).options(workers=-1)


def test_document_workers_pickle_their_operators_once(tokenizer_dir) -> None:
    from zephon.ops.base import BuildContext
    from zephon.ops.tokenize import TokenizeSpec

    op = TokenizeSpec(tokenizer_id=tokenizer_dir).build(BuildContext(seed=0, lanes=1))
    pool = DocumentWorkers({0: [op]}, 2)
    assert pickle.loads(pool._payload)[0][0].spec == op.spec
    pool.close()


def test_workers_share_the_cores_among_their_tokenizers(monkeypatch) -> None:
    from zephon.engine import workers as module

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert [module._tokenizer_threads(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    payload = module._shared_copy(pickle.dumps({}))
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    module._start_worker(payload.name, payload.size, 4)
    assert os.environ["RAYON_NUM_THREADS"] == "4"
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")  # the user's own setting wins
    module._start_worker(payload.name, payload.size, 4)
    assert os.environ["RAYON_NUM_THREADS"] == "1"
    payload.close()
    payload.unlink()


_TRAINING_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
from tests.core.test_workers import source_for
from zephon import Pipeline


def short_enough(doc):  # defined in the script: the workers import it as spawn does
    return len(doc["text"]) < 500


def first_batches(workers, keep=short_enough):
    stream = iter(Pipeline(source_for({{"d": {data!r}}})).options(lanes=4, workers=workers)
                  .filter(keep).tokenize(tokenizer_id={tokenizer!r})
                  .pack_flat(65).batch(2))
    return [[r.payload["input_ids"].tolist() for r in next(stream).records] for _ in range(3)]


if __name__ == "__main__":
    def under_the_guard(doc):  # not defined when a worker imports the script
        return True

    try:
        first_batches(1, under_the_guard)
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
    assert first_batches(2) == first_batches(0)
    print("stopped", os.getpid(), flush=True)
"""


def run_script(template: str, tmp_path: Path, data: Path, tokenizer_dir: str,
               timeout: float) -> subprocess.CompletedProcess:
    """``template`` written as a training script (``root``, ``data`` and ``tokenizer``
    filled in) and run by path, as a trainer is."""
    script = tmp_path / "train.py"
    script.write_text(template.format(root=str(Path(__file__).resolve().parents[2]),
                                      data=str(data), tokenizer=tokenizer_dir))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout)


def test_a_training_script_that_stops_mid_stream_exits_quietly_and_frees_shared_memory(
        tmp_path, tokenizer_dir) -> None:
    """Training ends long before the data: results still in flight are freed at exit, with no
    tracebacks from shutdown and nothing left in /dev/shm. A filter defined in the script
    reaches the workers; one defined under the main guard, which they cannot import, is named
    in a ConfigError instead of a broken process pool."""
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"text": t} for t in make_documents(400, seed=5, min_words=50, max_words=90)])
    done = run_script(_TRAINING_SCRIPT, tmp_path, data, tokenizer_dir, timeout=120)
    assert done.returncode == 0, done.stderr
    refused, stopped = done.stdout.strip().splitlines()
    assert refused.startswith("ConfigError options(workers=...): a worker process cannot load")
    assert "under_the_guard" in refused and "workers=0" in refused
    word, pid = stopped.split()
    assert word == "stopped"
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr
    assert sorted(Path("/dev/shm").glob(f"{block_prefix(int(pid))}*")) == []


def test_discarded_and_unread_results_are_freed_once(tokenizer_dir) -> None:
    from multiprocessing import shared_memory

    from zephon.ops.base import BuildContext
    from zephon.ops.tokenize import TokenizeSpec

    op = TokenizeSpec(tokenizer_id=tokenizer_dir).build(BuildContext(seed=0, lanes=1))
    pool = DocumentWorkers({0: [op]}, 1)
    texts = make_documents(20, seed=6, min_words=50, max_words=60)
    docs = [Doc(None, f"d{i}", "d", fields={"text": t}) for i, t in enumerate(texts)]
    futures = [pool.submit(0, docs, ["x"] * len(docs)) for _ in range(3)]
    names = [f.result()[1] for f in futures]
    assert all(names)
    assert len(pool.result(futures[0])) == len(docs)
    pool.discard(futures[1])
    pool.discard(futures[1])  # a second discard is a no-op, not an error
    pool.discard(futures[0])  # already read: nothing to free
    assert pool._unread == {futures[2]}
    pool.close()
    for name in names:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)
    assert not pool._unread


def test_a_worker_that_dies_is_named_with_its_signal(tokenizer_dir) -> None:
    from zephon.errors import WorkerError
    from zephon.ops.base import BuildContext
    from zephon.ops.tokenize import TokenizeSpec

    op = TokenizeSpec(tokenizer_id=tokenizer_dir).build(BuildContext(seed=0, lanes=1))
    pool = DocumentWorkers({0: [op]}, 1)
    docs = [Doc(None, f"d{i}", "d", fields={"text": t})
            for i, t in enumerate(make_documents(10, seed=7))]
    assert len(pool.result(pool.submit(0, docs, ["x"] * len(docs)))) == len(docs)
    (pid,) = pool._pool._processes
    pending = pool.submit(0, docs * 200, ["x"] * len(docs) * 200)
    os.kill(pid, signal.SIGKILL)
    message = rf"pid {pid} was killed by SIGKILL, which the kernel's out-of-memory killer.*more"
    with pytest.raises(WorkerError, match=message):
        pool.result(pending)
    with pytest.raises(WorkerError, match=r"workers=1\) cannot go on"):
        pool.submit(0, docs, ["x"] * len(docs))
    pool.close()


def test_a_worker_that_cannot_load_the_operators_says_why(monkeypatch) -> None:
    from zephon.engine import workers as module

    vanishing = types.ModuleType("zephon_vanishing_ops")
    exec("def keep(doc):\n    return True", vanishing.__dict__)
    vanishing.keep.__module__ = vanishing.__name__
    monkeypatch.setitem(sys.modules, vanishing.__name__, vanishing)
    payload = pickle.dumps({0: (vanishing.keep,)})
    del vanishing.keep
    monkeypatch.setattr(module, "_LOAD_ERRORS", [])
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    block = module._shared_copy(payload)
    module._start_worker(block.name, len(payload), 1)  # raising would break the pool
    block.close()
    block.unlink()
    with pytest.raises(ConfigError, match=r"cannot load the document operators "
                       r"\(AttributeError: .*'keep'.*not under `if __name__"):
        _transform(0, [], [])


_UNGUARDED_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from tests.core.test_workers import source_for
from zephon import Pipeline

stream = iter(Pipeline(source_for({{"d": {data!r}}})).options(workers=1)
              .tokenize(tokenizer_id={tokenizer!r}).pack_flat(65).batch(2))
next(stream)
"""


def test_a_script_without_a_main_guard_fails_at_once_instead_of_hanging(
        tmp_path, tokenizer_dir) -> None:
    """Each spawned worker imports the script, which starts the loader again and fails before
    reading its start-up data; the loader then names the cause (it used to block forever)."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_documents(20, seed=8)])
    done = run_script(_UNGUARDED_SCRIPT, tmp_path, data, tokenizer_dir, timeout=90)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("zephon.errors.WorkerError: zephon: a document worker process died")
    assert "exited with status 1" in last and "if __name__" in last
