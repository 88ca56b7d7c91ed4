"""A process iterating with worker processes and ended by SIGTERM or SIGKILL leaves no process
and nothing in /dev/shm behind; SIGTERM unwinds like Ctrl-C; a trainer's handler is kept."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import sigint_default_in_children, write_jsonl
from zephon.demo.assets import make_documents

# Every process of the run (the parent, and the spawned workers, which import this as their
# main module) writes the names of the shared memory blocks and semaphores it creates to the
# log, so the test checks those, not whatever other jobs put in /dev/shm meanwhile. The run
# iterates a pipeline with two workers beside one on document threads (workers=0), so both
# kinds are alive when the signal comes.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    from multiprocessing import shared_memory, synchronize

    LOG = os.environ["SHM_LOG"]

    def note(name):
        with open(LOG, "a") as log:
            log.write(name.lstrip("/") + "\\n")

    created = shared_memory.SharedMemory.__init__

    def shm_init(self, name=None, create=False, size=0, **kw):
        created(self, name, create, size, **kw)
        if create:
            note(self.name)

    shared_memory.SharedMemory.__init__ = shm_init
    made = synchronize.SemLock._make_name

    def sem_name():
        name = made()
        note("sem." + name.lstrip("/"))
        return name

    synchronize.SemLock._make_name = staticmethod(sem_name)

    if __name__ == "__main__":
        import signal, threading
        from zephon import Pipeline
        from zephon.io import Dataset
        from zephon.work import MixtureSpec, StaticMixtureWorkSource

        def pipeline(workers):
            source = StaticMixtureWorkSource([Dataset.from_path("d", sys.argv[1])],
                                             MixtureSpec({"d": 1.0}), repeat=["d"])
            return (Pipeline(source).options(workers=workers, prefetch=2)
                    .tokenize(tokenizer_id=sys.argv[2]).pack_flat(65).batch(2))

        if sys.argv[3] == "own-handler":
            signal.signal(signal.SIGTERM, lambda *_: print("own handler", flush=True))
        try:
            for i, _ in enumerate(zip(pipeline(2), pipeline(0))):
                if i == 2:
                    names = sorted({t.name for t in threading.enumerate()})
                    print("ready", *names, flush=True)
                time.sleep(0.05)
        finally:
            print("closed", flush=True)
""")


class Run:
    """The child process, its descendants when it is ready, and what it wrote."""

    def __init__(self, tmp_path: Path, tokenizer_dir: str, mode: str):
        data = write_jsonl(tmp_path / "docs.jsonl",
                           [{"text": t} for t in make_documents(60)])
        script = tmp_path / "run.py"
        script.write_text(SCRIPT)
        self.log, self.out = tmp_path / "shm.log", tmp_path / "out.txt"
        # Output goes to a file, not a pipe: workers that outlive the child would hold a
        # pipe open and leave the test blocked reading it.
        with open(self.out, "w") as out, sigint_default_in_children():
            self.proc = subprocess.Popen(
                [sys.executable, str(script), str(data), tokenizer_dir, mode], stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "SHM_LOG": str(self.log)})
        self.descendants: list[psutil.Process] = []
        deadline = time.monotonic() + 120
        while not self.output().startswith("ready") and "\nready" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.end()
                pytest.fail(f"the run never got ready:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        self.descendants = psutil.Process(self.proc.pid).children(recursive=True)
        # Two workers and the resource tracker.
        assert len(self.descendants) >= 3, self.descendants
        assert "zephon-documents" in self.output(), self.output()[-3000:]

    def output(self) -> str:
        return self.out.read_text()

    def left_in_shm(self) -> list[str]:
        names = set(self.log.read_text().split()) if self.log.exists() else set()
        assert names, "the run created no shared memory: the test would prove nothing"
        return sorted(n for n in names if (Path("/dev/shm") / n).exists())

    def alive_after(self, seconds: float) -> list[psutil.Process]:
        """The descendants still running once ``seconds`` have passed (or none earlier)."""
        deadline = time.monotonic() + seconds
        while True:
            alive = [p for p in self.descendants if _running(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)

    def end(self) -> None:
        """Kill whatever of the run is left, so that a failing test leaks nothing: the
        resource tracker last, as it unlinks what it holds once the others are gone, then
        whatever the run created that is still in /dev/shm."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        tracker = [p for p in self.descendants if _running(p)
                   and "resource_tracker" in " ".join(p.cmdline())]
        _kill([p for p in self.descendants if p not in tracker])
        psutil.wait_procs(tracker, timeout=5)
        _kill(tracker)
        for name in self.log.read_text().split() if self.log.exists() else ():
            (Path("/dev/shm") / name).unlink(missing_ok=True)


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def run(tmp_path, tokenizer_dir):
    runs: list[Run] = []

    def start(mode: str = "default") -> Run:
        runs.append(Run(tmp_path, tokenizer_dir, mode))
        return runs[-1]

    yield start
    for started in runs:
        started.end()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "SIGTERM to the process group"])
def test_nothing_outlives_a_process_ended_by_a_signal(run, how):
    child = run()
    sent = time.monotonic()
    if how.endswith("group"):  # what Slurm's scancel and a terminal's Ctrl-C do
        os.killpg(child.proc.pid, signal.SIGTERM)
    else:
        child.proc.send_signal(getattr(signal, how))
    code = child.proc.wait(timeout=30)
    assert child.alive_after(5) == []
    assert time.monotonic() - sent < 20
    assert child.left_in_shm() == []
    rest = child.output().split("ready", 1)[1]
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:  # unwound as on Ctrl-C: the finally block ran
        assert code == 128 + signal.SIGTERM and "closed" in rest, rest[-3000:]


def test_a_trainers_own_sigterm_handler_is_kept(run):
    child = run("own-handler")
    child.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert child.proc.poll() is None  # the trainer's handler only printed
    child.proc.send_signal(signal.SIGINT)
    child.proc.wait(timeout=30)
    rest = child.output().split("ready", 1)[1]
    assert "own handler" in rest and "closed" in rest, rest[-3000:]
    assert child.alive_after(5) == []
    assert child.left_in_shm() == []


def test_the_default_action_returns_once_the_workers_are_gone(tokenizer_dir, tmp_path):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    data = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(20)])
    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", data)]))
                .options(workers=1, prefetch=0).tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(65).batch(2))
    from zephon.engine import workers

    assert no_workers_left(workers), workers_holders(workers)
    before = signal.getsignal(signal.SIGTERM)
    next(iter(pipeline))
    assert signal.getsignal(signal.SIGTERM) is not before
    del pipeline
    gc.collect()
    assert signal.getsignal(signal.SIGTERM) is before


def no_workers_left(workers, patience_s: float = 60.0) -> bool:
    """Whether the worker pools of earlier tests in this process are gone: collected, once
    the threads that still held their pipelines (a read-ahead thread winding down) have
    ended. Waits up to ``patience_s`` for them; a pool still alive then is a leak."""
    deadline = time.monotonic() + patience_s
    while True:
        gc.collect()
        if not workers._USERS or time.monotonic() > deadline:
            return not workers._USERS
        time.sleep(0.05)


def workers_holders(workers) -> str:
    """What holds the worker pools still alive (for the failure message)."""
    alive = [o for o in gc.get_objects() if isinstance(o, workers.DocumentWorkers)]
    return "; ".join(f"{len(alive)} pool(s) alive, held by "
                     f"{sorted({type(r).__name__ for r in gc.get_referrers(o)})}"
                     for o in alive[:3]) or f"{len(workers._USERS)} registered, none alive"
