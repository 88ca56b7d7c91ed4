"""Tracing one step deep into a run costs what tracing the first step costs.

Builds a run over the demo corpus (4 lanes, microbatches of 4 rows of 129 tokens, 4
microbatches per step, repeated data), trains it for ``--steps`` steps in one process and
keeps the loader state, then times, each in a fresh process (so the tokenizer and the files are
loaded in each): ``zephon trace`` of step 1 from the start, and of the step after the state
from the state. Prints both times and their ratio.

Usage: ``python -m benchmarks.trace_step [--steps 10000]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = """\
seed = 3
lanes = 4
[[datasets]]
name = "demo"
path = "demo:corpus"
[mixture]
repeat = ["demo"]
[tokenize]
tokenizer = "demo:tokenizer"
[pack]
algorithm = "wrap"
max_length = 129
[batch]
microbatch_size = 4
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    from zephon.recipe import DataRecipe

    with tempfile.TemporaryDirectory() as scratch:
        recipe = Path(scratch) / "data.toml"
        recipe.write_text(RECIPE)
        pipeline = DataRecipe.from_toml(recipe).build(seq_len=128, microbatch_size=4,
                                                      dp_rank=0, dp_world_size=1, lanes=4)
        start = time.perf_counter()
        for _, _batch in zip(range(args.steps * 4), pipeline, strict=False):
            pass
        print(f"trained {args.steps:,} steps ({args.steps * 4:,} microbatches) in "
              f"{time.perf_counter() - start:.1f} s")
        state = Path(scratch) / "state.json"  # plain data: a loader state is never unpickled
        state.write_text(json.dumps(pipeline.state_dict()))
        common = [sys.executable, "-m", "zephon.cli", "trace", str(recipe), "--seq-len", "128",
                  "--global-batch-size", "16", "--json"]
        timings = {}
        for name, extra in (("step 1, fresh", ["--steps", "1"]),
                            (f"step {args.steps + 1:,}, from the state",
                             ["--steps", str(args.steps + 1), "--from-state", str(state)])):
            runs = []
            for _ in range(3):
                began = time.perf_counter()
                subprocess.run(common + extra, check=True, capture_output=True)
                runs.append(time.perf_counter() - began)
            timings[name] = sorted(runs)[1]
            print(f"zephon trace {name}: {timings[name]:.2f} s (median of 3 processes)")
        fresh, deep = timings.values()
        print(f"ratio: {deep / fresh:.2f}x")


if __name__ == "__main__":
    main()
