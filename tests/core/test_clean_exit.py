"""A process that iterates a pipeline exits with its own exit code, whichever way it leaves the
loop: no loader thread is still running when the interpreter tears down (a daemon thread ended
inside native code there aborts the process with status 134)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The child prints, from an atexit callback registered after zephon is imported (so it runs
# before any atexit callback of zephon's, and after threading's own shutdown), the loader
# threads still alive: the ones the interpreter would end at finalization.
SCRIPT = textwrap.dedent("""
    import atexit, sys, threading
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    @atexit.register
    def alive():
        names = sorted(t.name for t in threading.enumerate()
                       if t.name.startswith("zephon") and t.is_alive())
        print("alive at exit:", ",".join(names), flush=True)

    corpus, tokenizer, how = sys.argv[1:4]
    source = StaticMixtureWorkSource([Dataset.from_path("d", corpus)], MixtureSpec({"d": 1.0}),
                                     repeat=[] if how == "end" else ["d"])
    pipeline = (Pipeline(source).options(lanes=2, prefetch=4)
                .tokenize(tokenizer_id=tokenizer, engine="auto").pack_flat(257).batch(2))
    kept = iter(pipeline)  # held to the end, as a trainer object holds its iterator
    for step, batch in enumerate(kept):
        batch.to_training(return_labels=True)
        if how == "raise" and step == 3:
            raise RuntimeError("the training step failed")
        if how == "exit" and step == 3:
            sys.exit(7)
        if how == "early" and step == 3:
            break
    print("loop left", flush=True)
""")

EXPECTED_CODE = {"early": 0, "end": 0, "raise": 1, "exit": 7}


@pytest.mark.parametrize("how", list(EXPECTED_CODE))
def test_no_loader_thread_outlives_the_loop_at_exit(demo_assets, tmp_path, how):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), demo_assets["corpus"],
                           demo_assets["tokenizer"], how],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == EXPECTED_CODE[how], done.stderr[-3000:]
    assert "FATAL" not in done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("alive at exit:")]
    assert line == "alive at exit: ", done.stdout
    if how == "raise":
        assert "RuntimeError: the training step failed" in done.stderr
