"""Pre-tokenized sources at memory speed: token columns and Megatron indexed datasets.

Builds (once, cached under ``--root``) ``--docs`` documents of 200-2000 random token ids and
writes them twice: as Parquet files with a ``list<int32>`` column and as one Megatron indexed
dataset (uint16). Then, in fresh subprocesses and alternating ``--repeats`` times, runs
``pretokenized -> pack_flat(2049, "wrap") -> batch(8) -> to_training(return_labels=True)``
over each, one rank, and prints tokens/s of wall time and tokens per CPU second (per core),
in two ways of consuming:

- ``tight``: the loop takes batches as fast as it can, the loader in the loop's thread
  (prefetch 0), so CPU per token is the loader's own cost;
- ``trainer``: the loader reads ahead on its thread (prefetch 4) and the loop holds the GIL
  for 2 ms per batch (kernel launches) and then sleeps 20 ms (the GPU's step); it reports the
  mean and worst wait for a batch after the first, the stall a trainer would see.

``--profile`` prints the top functions of a cProfile run of the tight loop over the indexed
dataset. Usage: ``python -m benchmarks.pretokenized [--docs 20000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build_corpus(root: Path, n_docs: int) -> dict[str, str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.io.indexed import write_indexed_dataset

    target = root / f"pretokenized-{n_docs}"
    done = target / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    (target / "parquet").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 50_000, size=int(rng.integers(200, 2000)), dtype=np.int32)
            for _ in range(n_docs)]
    per_file = -(-n_docs // 8)
    for i in range(8):
        chunk = docs[i * per_file:(i + 1) * per_file]
        pq.write_table(pa.table({"input_ids": pa.array(chunk, pa.list_(pa.int32()))}),
                       target / "parquet" / f"part-{i}.parquet", row_group_size=256)
    prefix = write_indexed_dataset(target / "indexed_text_document", docs, dtype=np.uint16)
    paths = {"parquet": str(target / "parquet"), "indexed": prefix,
             "tokens": int(sum(len(d) for d in docs))}
    done.write_text(json.dumps(paths))
    return paths


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pipeline_for(path: str, prefetch: int):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("bench", path)], seed=0)
    return (Pipeline(source).options(prefetch=prefetch).pretokenized(eos_token_id=0)
            .pack_flat(2049, "wrap").batch(8, drop_last=False))


def child(path: str, mode: str) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    cpu = cpu_seconds()
    start = time.perf_counter()
    tokens, waits = 0, []
    pipeline = pipeline_for(path, 0 if mode == "tight" else 4)
    iterator = iter(pipeline)
    while True:
        asked = time.perf_counter()
        batch = next(iterator, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - asked)
        out = batch.to_training(return_labels=True)
        tokens += int(out["input_ids"].numel()) + len(batch)
        if mode == "trainer":
            busy = time.perf_counter() + 0.002
            while time.perf_counter() < busy:  # holds the GIL, as kernel launches do
                pass
            time.sleep(0.020)
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "cpu": cpu_seconds() - cpu,
            "first_s": waits[0], "mean_wait_ms": 1000 * statistics.mean(waits[1:]),
            "max_wait_ms": 1000 * max(waits[1:]), "batches": len(waits)}


def profile(path: str) -> None:
    import cProfile
    import pstats

    pipeline = pipeline_for(path, 0)
    profiler = cProfile.Profile()
    profiler.enable()
    for batch in pipeline:
        batch.to_training(return_labels=True)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def run_child(path: str, mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.pretokenized", "--child", mode,
                          "--path", path], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", choices=["tight", "trainer"])
    parser.add_argument("--path")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.path, args.child)))
        return
    paths = build_corpus(Path(args.root), args.docs)
    print(f"corpus: {args.docs:,} documents, {paths['tokens']:,} tokens "
          "(Parquet list<int32> column; one indexed dataset, uint16)")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for source in ("parquet", "indexed"):
            for mode in ("tight", "trainer"):
                result = run_child(paths[source], mode)
                results.setdefault((source, mode), []).append(result)
                print(f"  run {repeat + 1} {source:<8} {mode:<8} "
                      f"{result['tokens'] / result['seconds'] / 1e6:6.1f}M tokens/s wall, "
                      f"{result['tokens'] / result['cpu'] / 1e6:6.1f}M tokens per CPU s, "
                      f"first batch {result['first_s']:.3f} s, waits mean "
                      f"{result['mean_wait_ms']:.2f} ms max {result['max_wait_ms']:.1f} ms")
    print()
    for (source, mode), runs in results.items():
        wall = statistics.median(r["tokens"] / r["seconds"] for r in runs)
        per_core = statistics.median(r["tokens"] / r["cpu"] for r in runs)
        worst = max(r["max_wait_ms"] for r in runs)
        mean = statistics.median(r["mean_wait_ms"] for r in runs)
        if mode == "tight":
            print(f"{source:<8} tight    median {wall / 1e6:6.1f}M tokens/s wall, "
                  f"{per_core / 1e6:6.1f}M tokens per CPU second (the loader's cost per core)")
        else:
            print(f"{source:<8} trainer  waits for a batch after the first: median of means "
                  f"{mean:.2f} ms, worst {worst:.1f} ms (the loop's own 22 ms per batch "
                  "bounds the throughput)")
    if args.profile:
        profile(paths["indexed"])


if __name__ == "__main__":
    main()
