"""Loader state: size of ``state_dict()`` and time to restore, as training goes on.

A realistic pipeline: two datasets mixed by tokens, 8 lanes, wrap packing to 2049 tokens, a
packed-row shuffle buffer of 64 rows per lane, microbatches of 8. For each checkpoint point it
prints the pickled size of one rank's state (W=1: all 8 lanes, and W=8: one lane), the time to
take it, and the time to restore it into a fresh pipeline up to its first batch. The size is
bounded by the open rows and the shuffle buffer (64 x 2049 tokens x 8 bytes of ids and positions
per lane) and does not grow with progress; restoring reads one unit per dataset and lane, never
replays. Usage: ``python -m benchmarks.state_size``.
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

from benchmarks.throughput import build_corpus
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def build(paths: dict[str, str], shuffle: int) -> Pipeline:
    files = sorted(Path(paths["data"]).glob("*.parquet"))
    source = StaticMixtureWorkSource(
        [Dataset.from_path("web", str(files[0])), Dataset.from_path("books", str(files[-1]))],
        MixtureSpec({"web": 0.7, "books": 0.3}), seed=1, token_estimation=TokenEstimation(),
        repeat=True)
    return (Pipeline(source).options(lanes=8, prefetch=4)
            .tokenize(tokenizer_id=paths["tokenizer"]).pack_flat(2049, "wrap")
            .shuffle(shuffle).batch(8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--shuffle", type=int, default=64)
    parser.add_argument("--checkpoints", default="16,64,160")
    args = parser.parse_args()
    paths = build_corpus(Path(args.root), args.docs, args.files)
    base = build(paths, args.shuffle)
    pipeline = base
    iterator = iter(pipeline)
    consumed = 0
    print(f"{'microbatches':>12} {'state W=1':>12} {'one lane':>10} {'take':>8} {'restore':>9}")
    for target in (int(x) for x in args.checkpoints.split(",")):
        while consumed < target:
            next(iterator)
            consumed += 1
        start = time.perf_counter()
        state = pipeline.state_dict()
        blob = pickle.dumps(state)
        took = time.perf_counter() - start
        one_lane = len(pickle.dumps({"lane_0": state["lane_0"]}))
        start = time.perf_counter()
        fresh = build(paths, args.shuffle)
        fresh.load_state_dict(pickle.loads(blob))
        next(iter(fresh))
        restore = time.perf_counter() - start
        print(f"{consumed:>12} {len(blob) / 2**20:>10.2f}MiB {one_lane / 2**20:>8.2f}MiB "
              f"{took * 1000:>6.1f}ms {restore:>8.2f}s")


if __name__ == "__main__":
    main()
