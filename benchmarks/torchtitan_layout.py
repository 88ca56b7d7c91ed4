"""TorchTitan step time with the two batch layouts of the Zephon loader, side by side.

The TorchTitan adapter hands a microbatch either as one flattened row (``[1, B*S]``, the
recipe's ``[to_training] flatten = true``, its default) or as ``[B, S]`` rows
(``flatten = false``). Both give the same logits (every row starts at position 0 and
TorchTitan's document mask follows position resets), so the choice is one of speed: this
script trains TorchTitan's llama3 debug model on the bundled corpus with each layout (the
recipe and launch TOML of ``python -m zephon_torchtitan_tools.demo``), alternating runs, and
prints the median seconds a step (steps after ``--warmup``, from the log lines'
timestamps) and TorchTitan's tokens/s for each.

Usage: ``python -m benchmarks.torchtitan_layout [--rows 4] [--seq-len 256] [--steps 12]
[--repeats 3]``. It runs on CPU (the demo launch sets ``cpu = true``: the adapter's CPU
shims); on a GPU the answer may differ (compiled FlexAttention), so measure there before
choosing.
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import tempfile
from pathlib import Path

from zephon_torchtitan_tools.demo import run_training, write_demo_recipes

_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*step:\s*(\d+)\b.*?tps:\s*([\d,]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

def one_run(folder: Path, flatten: bool, args: argparse.Namespace) -> tuple[float, float]:
    """(median seconds a step, median tokens/s) of one training with the layout."""
    run = folder / f"flatten-{flatten}"
    launch = write_demo_recipes(run, args.steps)  # the demo's recipe and launch TOML
    data = run / "data.toml"
    data.write_text(data.read_text() + f"flatten = {str(flatten).lower()}\n")
    code, output, _ = run_training(
        ["--toml", str(launch), "--training.seq_len", str(args.seq_len),
         "--training.local_batch_size", str(args.rows)], cwd=run, timeout=1800)
    if code:
        raise RuntimeError(output[-3000:])
    steps: dict[int, tuple[datetime.datetime, float]] = {}
    for line in _ANSI.sub("", output).splitlines():
        found = _STAMP.search(line)
        if found and "validate" not in line:
            when = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            steps.setdefault(int(found.group(2)), (when, float(found.group(3).replace(",", ""))))
    kept = [s for s in sorted(steps) if s > args.warmup]
    gaps = [(steps[s][0] - steps[s - 1][0]).total_seconds() for s in kept if s - 1 in steps]
    if not gaps:
        raise RuntimeError("no step lines with timestamps and tps found:\n" + output[-3000:])
    return statistics.median(gaps), statistics.median(steps[s][1] for s in kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="zephon-layout-") as scratch:
        for repeat in range(args.repeats):
            for flatten in (True, False) if repeat % 2 == 0 else (False, True):
                results[flatten].append(one_run(Path(scratch), flatten, args))
                seconds, tps = results[flatten][-1]
                print(f"run {repeat + 1} flatten={flatten}: {seconds:.3f} s a step, "
                      f"{tps:,.0f} tokens/s", flush=True)
    print(f"{args.rows} rows of {args.seq_len}, steps {args.warmup + 1}-{args.steps}, "
          f"medians of {args.repeats} runs each:")
    for flatten, runs in results.items():
        layout = "[1, B*S] (flatten = true)" if flatten else "[B, S] (flatten = false)"
        print(f"  {layout}: {statistics.median(s for s, _ in runs):.3f} s a step, "
              f"{statistics.median(t for _, t in runs):,.0f} tokens/s")
    ratios = [f / r for (f, _), (r, _) in zip(results[True], results[False], strict=True)]
    print(f"  step time flattened / rows, per pair: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
