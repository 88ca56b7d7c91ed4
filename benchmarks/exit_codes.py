"""Exit codes of training processes that leave the loop, on a quiet and on a busy host.

Runs a small training loop (the demo corpus, Parquet; ``engine="auto"``, read-ahead on) that
ends after a few microbatches while keeping its iterator, ``--runs`` times as one process and
``--jobs`` times as a torchrun job of two processes (gloo), half of each while other
processes keep every core busy; prints the exit codes seen. Each ``--endings`` value is one
way to end: ``early`` leaves the loop (exit code 0), ``raise`` raises from it (1), ``exit``
calls ``sys.exit(7)`` (7), ``sigterm`` sends the process SIGTERM (killed by it: -15). Every
code should be the ending's own: an abort at exit (134, "FATAL: exception not rethrown") means
a loader thread was still inside native code when the interpreter tore down.

    python -m benchmarks.exit_codes --runs 50 --jobs 10 [--endings early,raise,exit,sigterm]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from zephon.demo.assets import build_demo_assets

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch.distributed as dist
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    corpus, tokenizer, ending, stop_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    source = StaticMixtureWorkSource([Dataset.from_path("d", corpus)], MixtureSpec({"d": 1.0}),
                                     repeat=["d"])
    pipeline = (Pipeline(source).options(lanes=2, dp_rank=rank, dp_world_size=world)
                .tokenize(tokenizer_id=tokenizer, engine="auto").pack_flat(2049).batch(4))
    kept = iter(pipeline)
    for step, batch in enumerate(kept):
        batch.to_training(return_labels=True)
        if step == stop_at:
            if ending == "raise":
                raise RuntimeError("the training step failed")
            if ending == "exit":
                sys.exit(7)
            if ending == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            break
    if world > 1:
        dist.destroy_process_group()
""")


EXPECTED = {"early": 0, "raise": 1, "exit": 7, "sigterm": -15}
"""Each ending's own exit code in one process (torchrun exits with 1 for a failed worker)."""


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        pass


def run(command: list[str], busy: bool) -> tuple[int, bool]:
    """(exit code, whether stderr says FATAL) of ``command``, with every core kept busy by
    other processes when ``busy``."""
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
                for _ in range(os.cpu_count() or 2)] if busy else []
    for spinner in spinners:
        spinner.start()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    return done.returncode, "FATAL" in done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="single-process runs")
    parser.add_argument("--jobs", type=int, default=4, help="torchrun jobs of two processes")
    parser.add_argument("--endings", default="early",
                        help="comma-separated: early, raise, exit, sigterm")
    args = parser.parse_args()
    assets = build_demo_assets()
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "train.py"
        script.write_text(SCRIPT)
        plain = [sys.executable, str(script), assets["corpus"], assets["tokenizer"]]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(script), assets["corpus"], assets["tokenizer"]]
        for ending, (label, command, count), busy in itertools.product(
                args.endings.split(","), (("one process", plain, args.runs),
                                          ("torchrun, 2 processes", torchrun, args.jobs)),
                (False, True)):
            codes: collections.Counter[int] = collections.Counter()
            fatal = 0
            for i in range(count // 2 if busy else count - count // 2):
                code, said_fatal = run([*command, ending, str(i % 5)], busy)
                codes[code] += 1
                fatal += said_fatal
            host = "busy" if busy else "quiet"
            shown = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
            own = EXPECTED[ending] if command is plain or ending == "early" else 1
            print(f"{ending:8s} {label:24s} {host:5s} host: exit codes {{{shown}}} (its own: "
                  f"{own}), FATAL {fatal}", flush=True)


if __name__ == "__main__":
    main()
