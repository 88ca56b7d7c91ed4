"""A process iterating with worker processes and ended by SIGTERM or SIGKILL leaves no process
and nothing in /dev/shm behind; SIGTERM unwinds like Ctrl-C; a trainer's handler is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import write_jsonl
from zephon.demo.assets import make_documents

# Every process of the run (the parent, and the spawned workers, which import this as their
# main module) writes the names of the shared memory blocks and semaphores it creates to the
# log, so the test checks those, not whatever other jobs put in /dev/shm meanwhile.
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
        import signal
        from zephon import Pipeline
        from zephon.io import Dataset
        from zephon.work import MixtureSpec, StaticMixtureWorkSource

        if sys.argv[3] == "own-handler":
            signal.signal(signal.SIGTERM, lambda *_: print("own handler", flush=True))
        source = StaticMixtureWorkSource([Dataset.from_path("d", sys.argv[1])],
                                         MixtureSpec({"d": 1.0}), repeat=["d"])
        pipeline = (Pipeline(source).options(workers=2, prefetch=2)
                    .tokenize(tokenizer_id=sys.argv[2]).pack_flat(65).batch(2))
        try:
            for i, _ in enumerate(pipeline):
                if i == 2:
                    print("ready", flush=True)
                time.sleep(0.05)
        finally:
            print("closed", flush=True)
""")


def start(tmp_path: Path, tokenizer_dir: str, mode: str = "default"):
    data = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(60)])
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    log = tmp_path / "shm.log"
    proc = subprocess.Popen([sys.executable, str(script), str(data), tokenizer_dir, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SHM_LOG": str(log)})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip() == "ready":
            break
    else:
        pytest.fail("".join(lines)[-3000:])
    descendants = psutil.Process(proc.pid).children(recursive=True)
    assert len(descendants) >= 3, descendants  # two workers and the resource tracker
    return proc, descendants, log, lines


def gone_within(descendants, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def left_in_shm(log: Path) -> list[str]:
    names = set(log.read_text().split()) if log.exists() else set()
    assert names, "the run created no shared memory: the test would prove nothing"
    return sorted(n for n in names if (Path("/dev/shm") / n).exists())


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_nothing_outlives_a_process_ended_by_a_signal(tmp_path, tokenizer_dir, how):
    proc, descendants, log, _ = start(tmp_path, tokenizer_dir)
    proc.send_signal(how)
    rest = proc.communicate(timeout=30)[0]
    assert gone_within(descendants, 5) == []
    assert left_in_shm(log) == []
    if how == signal.SIGTERM:  # unwound as on Ctrl-C: the finally block ran
        assert proc.returncode == 128 + signal.SIGTERM and "closed" in rest, rest[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL


def test_a_trainers_own_sigterm_handler_is_kept(tmp_path, tokenizer_dir):
    proc, descendants, log, _ = start(tmp_path, tokenizer_dir, "own-handler")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # the trainer's handler only printed
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[0]
    assert "own handler" in rest and "closed" in rest
    assert gone_within(descendants, 5) == []
    assert left_in_shm(log) == []


def test_the_default_action_returns_once_the_workers_are_gone(tokenizer_dir, tmp_path):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    data = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_documents(20)])
    pipeline = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("d", data)]))
                .options(workers=1, prefetch=0).tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(65).batch(2))
    before = signal.getsignal(signal.SIGTERM)
    next(iter(pipeline))
    assert signal.getsignal(signal.SIGTERM) is not before
    del pipeline
    import gc

    gc.collect()
    assert signal.getsignal(signal.SIGTERM) is before
