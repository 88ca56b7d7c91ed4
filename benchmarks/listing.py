"""Listing cost per file, this checkout against another revision of zephon, side by side.

Listing a local dataset opens each file once: its size, the blocks that identify its content
(:mod:`zephon.io.file_identity`) and, for Parquet, the footer. This benchmark times
``Dataset.files()`` over:

- ``--files`` small Parquet files (default 100,000: the files of
  :mod:`benchmarks.startup_scale`, one row group of 4 documents, about 1.5 KB each), where
  the last 4 KiB of a file are the whole file;
- ``--large`` larger JSON Lines files (default 5,000 of ``--large-size`` bytes, 256 KiB:
  1.3 GB), where the identity reads blocks across the file (the blocks read do not depend on
  the size past 20 KiB).

Each measurement runs in a fresh process with ``PYTHONPATH`` naming the core it lists with:
this checkout's, or ``--baseline``'s (a git revision, its ``core/`` extracted with ``git
archive``). The process first lists a folder of 16 files (imports and caches warm), then
times one listing of the whole folder, in CPU time (what other jobs on a shared machine move
least) and wall time. Rounds alternate which version goes first; each version's median over
``--rounds`` rounds is printed in microseconds a file, with the ratio.
The files are read from the page cache (a warm-up listing precedes the rounds): this measures
the CPU and system-call cost, not a disk's or a network filesystem's latency.

Usage: ``python -m benchmarks.listing [--baseline REV] [--files 100000] [--large 5000]
[--large-size 262144] [--rounds 5] [--root DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.startup_scale import build_files

ROOT = Path(__file__).resolve().parent.parent

TIMER = r"""
import json, sys, time
from zephon.io import Dataset
warm, folder = sys.argv[1], sys.argv[2]
Dataset.from_path("warm", warm).files()
wall, cpu = time.perf_counter(), time.process_time()
files = Dataset.from_path("timed", folder).files()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "files": len(files)}))
"""


def build_large(root: Path, count: int, size: int) -> Path:
    """``count`` JSON Lines files of ``size`` bytes (short documents), built once."""
    folder = root / f"large-{count}-{size}"
    data = folder / "data"
    if (folder / ".done").exists():
        return data
    data.mkdir(parents=True, exist_ok=True)
    lines = b"".join(json.dumps({"text": f"document {j} " + "some words " * (j % 40)}).encode()
                     + b"\n" for j in range(size // 100))
    for i in range(count):
        head = json.dumps({"text": f"file {i}"}).encode() + b"\n"
        (data / f"part-{i:06d}.jsonl").write_bytes(head + lines[:size - len(head)])
    (folder / ".done").write_text("")
    return data


def warm_folder(data: Path, root: Path) -> Path:
    """A folder of links to the first 16 files of ``data``, listed before the timed listing."""
    folder = root / f"warm-{data.parent.name}"
    if not folder.exists():
        folder.mkdir(parents=True)
        for path in sorted(data.iterdir())[:16]:
            os.symlink(path, folder / path.name)
    return folder


def list_once(core: Path, warm: Path, data: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) a file of one listing of ``data`` with the zephon under
    ``core``."""
    env = {**os.environ, "PYTHONPATH": str(core)}
    done = subprocess.run([sys.executable, "-c", TIMER, str(warm), str(data)], env=env,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["cpu"] / result["files"], result["wall"] / result["files"]


def extract(revision: str, into: Path) -> Path:
    """``revision``'s ``core/`` under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "core"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "core"


def compare(name: str, data: Path, cores: dict[str, Path], rounds: int, root: Path) -> None:
    warm = warm_folder(data, root)
    for core in cores.values():
        list_once(core, warm, data)  # the page cache and the dentry cache warm
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in cores}
    labels = list(cores)
    for r in range(rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            times[label].append(list_once(cores[label], warm, data))
    cells = []
    for column in (0, 1):  # CPU, then wall
        base, this = (statistics.median(t[column] for t in times[label]) * 1e6
                      for label in labels)
        cells.append(f"{base:>9.1f}{this:>8.1f}{this / base:>7.2f}")
    print(f"{name:<30}{cells[0]}   {cells[1]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="HEAD")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=5_000)
    parser.add_argument("--large-size", type=int, default=256 << 10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--root", type=Path, default=Path.home() / ".cache" / "zephon-bench")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cores = {args.baseline: extract(args.baseline, Path(tmp)), "this": ROOT / "core"}
        base = args.baseline[:8]
        print(f"{'us a file, median of ' + str(args.rounds):<30}{'CPU':>9}{'':>15}   "
              f"{'wall':>9}")
        print(f"{'':<30}{base:>9}{'this':>8}{'ratio':>7}   {base:>9}{'this':>8}{'ratio':>7}")
        if args.files:
            compare(f"{args.files:,} Parquet files", build_files(args.root, args.files), cores,
                    args.rounds, args.root)
        if args.large:
            compare(f"{args.large:,} JSON Lines of {args.large_size >> 10} KiB",
                    build_large(args.root, args.large, args.large_size), cores, args.rounds,
                    args.root)


if __name__ == "__main__":
    main()
