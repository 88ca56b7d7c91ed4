"""Units read ahead on the pipeline's reader thread against units read by the lanes themselves.

Over the corpus of ``benchmarks/throughput.py`` (built once under ``--root``), builds and runs
the pipeline of that benchmark (``tokenize(engine=...) -> pack_flat(2049, "wrap") -> batch(8)
-> to_training(return_labels=True)``) to its end ``--repeats`` times in one process for each
``--prefetch`` value, alternating ``UnitReads(units_ahead=0)`` (every unit read by its lane)
with the default (:data:`zephon.engine.unit_reads.UNITS_AHEAD`), and prints the median wall
seconds of each (the first run of each left out: the engine loading) and whether both gave
the same tokens.
Usage: ``python -m benchmarks.unit_reads [--docs 10000] [--repeats 8] [--prefetch 0,4]
[--lanes 1]``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import statistics
import time
from pathlib import Path

from benchmarks.throughput import bench_pipeline, build_corpus


def run(paths: dict[str, str], engine: str, prefetch: int, lanes: int) -> tuple[float, str]:
    """Wall seconds from building the pipeline to its last batch, and a digest of its ids."""
    digest = hashlib.sha256()
    start = time.perf_counter()
    for batch in bench_pipeline(paths, 0, engine).options(prefetch=prefetch, lanes=lanes):
        digest.update(batch.to_training(return_labels=True)["input_ids"].numpy().tobytes())
    return time.perf_counter() - start, digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--prefetch", default="0,4")
    parser.add_argument("--engine", default="fastokens")
    parser.add_argument("--lanes", type=int, default=1,
                        help="lanes of the pipeline (TorchTitan's default is 8 a rank): each "
                        "lane's sources share the pipeline's UNITS_AHEAD slots")
    parser.add_argument("--root", default=".bench")
    args = parser.parse_args()

    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    import zephon.runtime as runtime
    from zephon.engine.unit_reads import UNITS_AHEAD, UnitReads

    paths = build_corpus(Path(args.root), args.docs, args.files)
    for prefetch in (int(p) for p in args.prefetch.split(",")):
        seconds: dict[int, list[float]] = {0: [], UNITS_AHEAD: []}
        digests = set()
        for _ in range(args.repeats):
            for ahead in seconds:
                runtime.UnitReads = functools.partial(UnitReads, units_ahead=ahead)
                wall, digest = run(paths, args.engine, prefetch, args.lanes)
                seconds[ahead].append(wall)
                digests.add(digest)
        runtime.UnitReads = UnitReads
        itself, ahead = (statistics.median(seconds[a][1:]) for a in seconds)
        print(f"lanes {args.lanes}, prefetch {prefetch}: units read by the lanes {itself:.3f} s, "
              f"read ahead {ahead:.3f} s ({ahead / itself:.2f}x the time; medians of "
              f"{args.repeats - 1}); "
              f"the same tokens: {'yes' if len(digests) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
