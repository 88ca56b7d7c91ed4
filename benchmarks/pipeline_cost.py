"""Where the pipeline's time goes once tokenizing is cheap: each stage alone, and the rest.

Over the corpus of ``benchmarks/throughput.py`` (built once under ``--root``), in one process
and on one thread (``prefetch=0``, so no stage overlaps another), measures in turn, ``--repeats``
times each, alternating:

- ``read``: every Parquet unit read as the lanes read it (``zephon.io.formats.read_unit``:
  the row group decoded, its text checked as UTF-8, the column made Python strings);
- ``encode``: those texts through the tokenize operator's encoder (``engine="fastokens"``) in
  batches of ``--chunk`` texts, BOS/EOS framed as the operator frames them;
- ``pack``: the encoded documents (made beforehand) through ``pack_flat(2049, "wrap")``;
- ``to_training``: the packed rows in microbatches of 8 through
  ``SampleBatch.to_training(return_labels=True)``;
- ``pipeline``: the whole pipeline (``tokenize(engine="fastokens") -> pack_flat(2049, "wrap")
  -> batch(8) -> to_training(return_labels=True)``), built and run to its end, after one
  untimed warm-up run in the same process.

``rest`` is the pipeline's time less the four stages: the read-ahead (a document object a row,
its position for resume), the tokenize operator's per-document checks and pieces, the mixer,
batching, the lane and its state bookkeeping. Prints for each the median wall and CPU seconds,
its share of the pipeline's wall time, and its cost a token, a document and a row; ``encode``
uses every core (fastokens's threads), the rest one. The machine's other jobs move single
runs by 20-30%: compare shares and medians of several repeats, not one run.

``--instructions`` counts instead what the machine's other jobs cannot move: the instructions
one pipeline run executes (valgrind's callgrind; the process run with the pipeline run once
and twice, the difference taken, so loading and set-up cancel), by library: the Python
interpreter (the pipeline's own Python, and making the texts Python strings), Arrow (Parquet
decoding), the tokenizer engine, numpy, the C library (copies, allocation). About 2 minutes
for the 4,000-document corpus (``--docs 4000``); callgrind runs the engine's threads one at a
time, so the counts are the same whatever the cores.
Usage: ``python -m benchmarks.pipeline_cost [--docs 10000] [--repeats 5] [--instructions]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.throughput import build_corpus

STAGES = ("read", "encode", "pack", "to_training")


class Stages:
    """The corpus's data at each stage's input, made once, and a timed run of each stage."""

    def __init__(self, paths: dict[str, str], chunk: int):
        from zephon.io.formats import plan_file
        from zephon.io.units import PlanHints
        from zephon.ops.tokenize import DocumentTokenizer, TokenizeSpec

        self.paths = paths
        self.chunk = chunk
        hints = PlanHints(unit_bytes=64 << 20, arrow_unit_rows=1 << 20)
        self.units = [(str(path), unit)
                      for path in sorted(Path(paths["data"]).glob("*.parquet"))
                      for unit in plan_file(str(path), "parquet", None, hints)]
        self.tokenizer = DocumentTokenizer(TokenizeSpec(tokenizer_id=paths["tokenizer"],
                                                        engine="fastokens"))
        self.texts = self.read()
        self.docs = self.encode()
        self.rows = self.pack(keep=True)
        self.tokens = sum(d.tokens.size for d in self.docs)

    def read(self) -> list[str]:
        from zephon.io.formats import read_unit

        texts: list[str] = []
        for path, unit in self.units:
            columns, _keys = read_unit(path, "parquet", None, unit, ["text"], path)
            texts += columns["text"]
        return texts

    def encode(self) -> list[Any]:
        from zephon.records import Doc

        docs = []
        tokenizer = self.tokenizer
        for start in range(0, len(self.texts), self.chunk):
            for pieces in tokenizer.encode(self.texts[start:start + self.chunk]):
                docs += [Doc(p, f"bench:{len(docs)}", "bench") for p in pieces]
        return docs

    def pack(self, keep: bool = False) -> list[Any]:
        """The rows (only with ``keep``: timed, they are dropped as made, as the pipeline
        drops them once batched; kept, 97 MB of new rows would be timed faulting pages in)."""
        from zephon.ops.pack import Packer, PackFlatSpec

        packer = Packer(PackFlatSpec(2049), 0, 0)
        rows = []
        for doc in self.docs:
            made = packer.add(doc)
            if keep:
                rows += made
        return rows + packer.flush()

    def to_training(self) -> int:
        from zephon.sample_batch import SampleBatch

        tokens = 0
        for start in range(0, len(self.rows), 8):
            out = SampleBatch(self.rows[start:start + 8]).to_training(return_labels=True)
            tokens += int(out["input_ids"].numel())
        return tokens

    def pipeline(self) -> int:
        from zephon import Pipeline
        from zephon.io import Dataset
        from zephon.work import MixtureSpec, StaticMixtureWorkSource

        source = StaticMixtureWorkSource([Dataset.from_path("bench", self.paths["data"])],
                                         MixtureSpec({"bench": 1.0}), seed=0)
        pipeline = (Pipeline(source).options(prefetch=0)
                    .tokenize(tokenizer_id=self.paths["tokenizer"], field="text",
                              engine="fastokens")
                    .pack_flat(2049, "wrap").batch(8, drop_last=False))
        tokens = 0
        for batch in pipeline:
            tokens += int(batch.to_training(return_labels=True)["input_ids"].numel())
        return tokens


def timed(run: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


LIBRARIES = (("interpreter", "libpython"), ("arrow", "libarrow"), ("arrow", "libparquet"),
             ("engine", "fastokens"), ("engine", "_native"), ("engine", "tokenizers"),
             ("numpy", "numpy"), ("C library", "libc.so"))


def instructions_by_library(paths: dict[str, str], args: argparse.Namespace) -> Counter:
    """Instructions of one pipeline run, by library: callgrind over a process that runs the
    pipeline ``runs`` times, for 2 and 1 runs, subtracted."""
    counts = []
    with tempfile.TemporaryDirectory() as scratch:
        for runs in (1, 2):
            out = f"{scratch}/callgrind.{runs}"
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                            sys.executable, "-m", "benchmarks.pipeline_cost", "--runs",
                            str(runs), "--docs", str(args.docs), "--files", str(args.files),
                            "--root", args.root], check=True, capture_output=True)
            table = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100",
                                    out], check=True, capture_output=True, text=True).stdout
            counts.append(_by_library(table))
    once, twice = counts
    return Counter({name: twice[name] - once[name] for name in twice})


def _by_library(table: str) -> Counter:
    totals: Counter = Counter()
    for line in table.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)", line)
        if not match or "PROGRAM TOTALS" in line:
            continue
        count, where = int(match.group(1).replace(",", "")), match.group(2)
        name = next((label for label, part in LIBRARIES if part in where), None)
        if name is None and "/Python-3" in where:  # the interpreter's own sources
            name = "interpreter"
        totals[name or "other"] += count
    return totals


def print_instructions(paths: dict[str, str], args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    counts = instructions_by_library(paths, args)
    stages = Stages(paths, args.chunk)
    total = sum(counts.values())
    print(f"instructions of one pipeline run: {total / 1e6:,.0f}M, "
          f"{total / stages.tokens:.0f} a token, {total / len(stages.docs):,.0f} a document")
    for name, count in counts.most_common():
        print(f"  {name:<12} {count / 1e6:9,.0f}M {count / total:6.1%} "
              f"{count / stages.tokens:7.1f} a token {count / len(stages.docs):9,.0f} a document")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=128,
                        help="texts a batch call in the encode stage")
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--instructions", action="store_true",
                        help="count one pipeline run's instructions by library (valgrind)")
    parser.add_argument("--runs", type=int, help=argparse.SUPPRESS)  # the counted process
    args = parser.parse_args()

    paths = build_corpus(Path(args.root), args.docs, args.files)
    if args.runs is not None:
        stages = Stages.__new__(Stages)
        stages.paths = paths
        for _ in range(args.runs):
            stages.pipeline()
        return
    if args.instructions:
        print_instructions(paths, args)
        return

    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    stages = Stages(paths, args.chunk)
    stages.pipeline()  # warm-up: the engine loaded, the tokenizer's self-check done
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in (*STAGES, "pipeline")}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(timed(getattr(stages, name)))
    wall = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
    cpu = {name: statistics.median(c for _, c in r) for name, r in runs.items()}
    wall["rest"] = wall["pipeline"] - sum(wall[s] for s in STAGES)
    cpu["rest"] = cpu["pipeline"] - sum(cpu[s] for s in STAGES)
    tokens, docs, rows = stages.tokens, len(stages.docs), len(stages.rows)
    print(f"{tokens:,} tokens, {docs:,} documents, {rows:,} rows of 2049; medians of "
          f"{args.repeats}; pipeline {tokens / wall['pipeline'] / 1e6:.2f}M tokens/s")
    print(f"{'stage':<12} {'wall s':>7} {'CPU s':>7} {'share':>6} {'ns/token':>9} "
          f"{'us/doc':>7} {'us/row':>7}")
    for name in (*STAGES, "rest", "pipeline"):
        seconds = wall[name]
        print(f"{name:<12} {seconds:7.3f} {cpu[name]:7.3f} "
              f"{seconds / wall['pipeline']:6.1%} {seconds / tokens * 1e9:9.1f} "
              f"{seconds / docs * 1e6:7.2f} {seconds / rows * 1e6:7.2f}")


if __name__ == "__main__":
    main()
