"""How closely a two-dataset mixture tracks its target from the first microbatches, beside
Megatron's blend.

Two datasets of short (about 200 tokens) and long (about 2,000 tokens) documents are mixed
by tokens at 0.7 / 0.3 into rows of 2049 tokens, 4 rows a microbatch, on 8 lanes; the share
of the first dataset in the tokens of the first 10, 100 and 1,000 global microbatches is
compared with 0.7. Megatron's ``BlendedDataset`` blends whole samples: sample ``i`` comes
from the dataset furthest below its share of ``i`` samples (``build_blending_indices``), so
its error after ``n`` samples of equal length is at most about ``1 / n``; the same samples
(microbatches x rows) are blended that way here for the comparison. ``--compare-with DIR``
runs another checkout's ``core`` beside this one (the same data, in a fresh process).

    python -m benchmarks.share_error [--lanes 8] [--compare-with ../other-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MARKS = (10, 100, 1000)
WEIGHTS = {"web": 0.7, "code": 0.3}


def write_data(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.demo.assets import make_documents

    for name, (n, low, high, seed) in {"web": (6000, 20, 300, 1),
                                       "code": (3000, 100, 1500, 2)}.items():
        docs = make_documents(n, seed=seed, min_words=low, max_words=high)
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            pq.write_table(pa.table({"text": docs[i::4]}), root / name / f"p{i}.parquet",
                           row_group_size=64)


def zephon_errors(root: str, lanes: int, rows: int) -> dict[int, float]:
    """Share error of ``web`` after each mark, from this process's zephon."""
    from zephon import Pipeline
    from zephon.demo.assets import build_demo_assets
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    source = StaticMixtureWorkSource([Dataset.from_path(n, Path(root) / n) for n in WEIGHTS],
                                     MixtureSpec(WEIGHTS), seed=1,
                                     token_estimation=TokenEstimation(), repeat=True)
    pipeline = (Pipeline(source).options(lanes=lanes, prefetch=0)
                .tokenize(tokenizer_id=build_demo_assets()["tokenizer"])
                .pack_flat(2049).batch(rows))
    tokens = dict.fromkeys(WEIGHTS, 0)
    out = {}
    for index, batch in enumerate(pipeline, start=1):
        for record in batch.records:
            for span in record.meta["documents"]:
                tokens[span.dataset] += span.length
        if index in MARKS:
            out[index] = abs(tokens["web"] / sum(tokens.values()) - WEIGHTS["web"])
        if index == MARKS[-1]:
            return out
    return out


def megatron_errors(rows: int) -> dict[int, float]:
    """Share error of ``web`` after each mark under Megatron's sample blending."""
    weights = list(WEIGHTS.values())
    counts = [0] * len(weights)
    out = {}
    for sample in range(MARKS[-1] * rows):
        at = max(sample, 1)
        errors = [w * at - c for w, c in zip(weights, counts, strict=True)]
        counts[errors.index(max(errors))] += 1
        if (sample + 1) % rows == 0 and (sample + 1) // rows in MARKS:
            out[(sample + 1) // rows] = abs(counts[0] / (sample + 1) - weights[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--rows", type=int, default=4, help="rows a microbatch")
    parser.add_argument("--compare-with", default=None,
                        help="another checkout whose core/ runs beside this one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(zephon_errors(args.child, args.lanes, args.rows)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        write_data(Path(scratch))
        columns = {"zephon": zephon_errors(scratch, args.lanes, args.rows)}
        if args.compare_with:
            env = {**os.environ,
                   "PYTHONPATH": str(Path(args.compare_with).resolve() / "core")}
            done = subprocess.run([sys.executable, "-m", "benchmarks.share_error", "--lanes",
                                   str(args.lanes), "--rows", str(args.rows), "--child",
                                   scratch], env=env, capture_output=True, text=True,
                                  check=True)
            columns[f"zephon at {args.compare_with}"] = {
                int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}
        columns["Megatron blend"] = megatron_errors(args.rows)
    print(f"share error of a 0.7/0.3 token mixture ({args.lanes} lanes, {args.rows} rows of "
          "2049 a microbatch)")
    print("microbatches  " + "  ".join(f"{name:>26}" for name in columns))
    for mark in MARKS:
        print(f"{mark:>12}  " + "  ".join(f"{errors.get(mark, float('nan')):>26.4f}"
                                          for errors in columns.values()))


if __name__ == "__main__":
    main()
