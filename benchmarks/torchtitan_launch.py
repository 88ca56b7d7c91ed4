"""Start-up of a TorchTitan launch with Zephon, over a corpus of many local files.

Writes ``--files`` Parquet files (``--rows`` short documents each) under ``--root``, a data
recipe over them and a launcher TOML for TorchTitan's llama3 debug model, then runs
``python -m zephon_torchtitan.train --toml launch.toml --training.steps 1`` ``--repeats``
times and prints, per run, the seconds from the start of the process to its first logged
training step and to its exit. ``--source DIR`` runs another checkout of this repository (its
``core`` and ``integrations`` go first on ``PYTHONPATH``); give two sources to compare them
side by side, alternating runs.

Usage: ``python -m benchmarks.torchtitan_launch [--files 2000] [--repeats 3]
[--source OLD_CHECKOUT --source .]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEP = re.compile(r"step:\s*1\b")
LAUNCH = """\
dump_folder = "{out}"
[base]
module = "llama3"
config = "llama3_debugmodel"
vocab_size = "tokenizer"
[training]
seq_len = 64
steps = 1
[checkpoint]
enable = false
[dataloader]
name = "zephon"
recipe = "data.toml"
"""
DATA = """\
seed = 1
lanes = 8
[[datasets]]
name = "many"
path = "{corpus}"
[tokenize]
tokenizer = "demo:tokenizer"
field = "text"
[pack]
algorithm = "wrap"
"""


def write_corpus(root: Path, files: int, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.demo.assets import make_documents

    corpus = root / f"corpus-{files}x{rows}"
    if (corpus / f"part-{files - 1:06d}.parquet").exists():
        return corpus
    corpus.mkdir(parents=True, exist_ok=True)
    texts = make_documents(rows * 4, seed=1, min_words=20, max_words=60)
    for i in range(files):
        chunk = [texts[(i * rows + j) % len(texts)] for j in range(rows)]
        pq.write_table(pa.table({"text": chunk}), corpus / f"part-{i:06d}.parquet")
    return corpus


def run(source: Path, workdir: Path) -> tuple[float, float]:
    """(seconds to the first logged step, seconds to exit) of one launch from ``source``."""
    paths = [source / "core", source / "integrations" / "torchtitan"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)),
           "OMP_NUM_THREADS": "2"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zephon_torchtitan.train", "--toml",
                             "launch.toml"], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first, log = None, []
    for line in proc.stdout:
        log.append(line)
        if first is None and STEP.search(line):
            first = time.perf_counter() - start
    proc.wait()
    total = time.perf_counter() - start
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"launch from {source} failed:\n{''.join(log[-40:])}")
    return first, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default="/tmp/zephon-bench-torchtitan-launch")
    parser.add_argument("--source", action="append", default=[])
    args = parser.parse_args()
    sources = [Path(s).resolve() for s in (args.source or ["."])]
    root = Path(args.root)
    corpus = write_corpus(root, args.files, args.rows)
    workdir = root / "launch"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data.toml").write_text(DATA.format(corpus=corpus))
    (workdir / "launch.toml").write_text(LAUNCH.format(out=workdir / "out"))
    results: dict[Path, list[tuple[float, float]]] = {s: [] for s in sources}
    for _ in range(args.repeats):
        for source in sources:
            results[source].append(run(source, workdir))
    print(f"TorchTitan launch, {args.files} Parquet files x {args.rows} rows, 1 step, "
          f"{args.repeats} runs each (median, min-max):")
    for source, runs in results.items():
        firsts, totals = [r[0] for r in runs], [r[1] for r in runs]
        print(f"  {source}: first step {statistics.median(firsts):.2f} s "
              f"({min(firsts):.2f}-{max(firsts):.2f}), exit {statistics.median(totals):.2f} s "
              f"({min(totals):.2f}-{max(totals):.2f})")


if __name__ == "__main__":
    main()
