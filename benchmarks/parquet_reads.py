"""Reading Parquet units the way a lane does: one at a time, with the lane's other work between.

A lane reads a unit (a row group), hands its texts to the tokenizer and packs, and reads the
next one 100-200 ms later. The Arrow memory pool the unit is read into decides how its buffers
come from the system: mimalloc (Arrow's default on Linux) asks for transparent huge pages and
keeps faulting new ones in as it reuses memory, each fault zeroing 2 MiB (and, on a host whose
memory is fragmented, waiting for compaction); jemalloc as Arrow configures it does not.

Reads the corpus of ``benchmarks/throughput.py`` (``--docs`` documents of 200-2000 words in 8
files, row groups of 256 texts) through ``zephon.io.formats.read_unit``, sleeping ``--gap-ms``
between units, in fresh subprocesses, alternating ``--repeats`` times between:

- ``loader pool``: the pool the loader reads into (``read_memory_pool``);
- ``default pool``: Arrow's default pool, chosen through ``ARROW_DEFAULT_MEMORY_POOL``.

Prints, per run and as medians, the process CPU seconds of all the reads (with the conversion
of texts to Python strings), the slowest single read's wall time, the minor page faults and the
huge pages faulted in meanwhile (``thp_fault_alloc`` of ``/proc/vmstat``: the whole system's,
so another process's can show too).
Usage: ``python -m benchmarks.parquet_reads [--repeats 5] [--gap-ms 50]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def huge_page_faults() -> int:
    """Transparent huge pages faulted in system-wide so far (0 where Linux does not say)."""
    try:
        with open("/proc/vmstat") as vmstat:
            for line in vmstat:
                if line.startswith("thp_fault_alloc "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def child(paths: dict[str, str], gap_s: float) -> dict[str, float]:
    from zephon.io import Dataset
    from zephon.io.formats import PlanHints, read_memory_pool, read_unit

    dataset = Dataset.from_path("bench", paths["data"])
    units = dataset.plan(PlanHints(unit_bytes=1 << 20, arrow_unit_rows=256), 1)  # row groups
    cpu = slowest = 0.0
    faults = 0
    huge_before = huge_page_faults()
    rows = 0
    for file_index, unit in units:
        data_file = dataset.files()[file_index]
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        table, keys = read_unit(data_file.path, data_file.fmt, data_file.compression, unit,
                                ["text"], data_file.path)
        slowest = max(slowest, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu += (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        faults += after.ru_minflt - before.ru_minflt
        rows += len(keys)
        del table
        time.sleep(gap_s)
    return {"cpu": cpu, "slowest_ms": slowest * 1000, "faults": faults, "units": len(units),
            "huge_pages": huge_page_faults() - huge_before,
            "rows": rows, "pool": read_memory_pool().backend_name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--child")
    parser.add_argument("--paths")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.paths), args.gap_ms / 1000)))
        return
    from benchmarks.throughput import build_corpus

    paths = build_corpus(Path(args.root), args.docs, 8)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    default = subprocess.run([sys.executable, "-c", "import pyarrow as pa; "
                              "print(pa.default_memory_pool().backend_name)"],
                             capture_output=True, text=True, check=True, env=env).stdout.strip()
    kinds = {"loader pool": env, "default pool": {**env, "ARROW_DEFAULT_MEMORY_POOL": default}}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        for kind, kind_env in kinds.items():
            out = subprocess.run([sys.executable, "-m", "benchmarks.parquet_reads", "--child",
                                  kind, "--paths", json.dumps(paths), "--gap-ms",
                                  str(args.gap_ms)], capture_output=True, text=True,
                                 check=True, env=kind_env)
            run = json.loads(out.stdout.strip().splitlines()[-1])
            runs[kind].append(run)
            print(f"  run {repeat + 1} {kind:<12} ({run['pool']}) {run['units']} units, "
                  f"{run['rows']:,} rows: {run['cpu']:.3f} CPU s, slowest read "
                  f"{run['slowest_ms']:.1f} ms, {run['faults']:,} page faults, "
                  f"{run['huge_pages']} huge pages", flush=True)
    print()
    for kind in kinds:
        median = {key: statistics.median(r[key] for r in runs[kind])
                  for key in ("cpu", "slowest_ms", "faults", "huge_pages")}
        print(f"{kind:<12} ({runs[kind][0]['pool']:<8}) CPU {median['cpu']:.3f} s "
              f"(runs {min(r['cpu'] for r in runs[kind]):.3f}-"
              f"{max(r['cpu'] for r in runs[kind]):.3f}), slowest read "
              f"{median['slowest_ms']:.1f} ms (worst {max(r['slowest_ms'] for r in runs[kind]):.1f}"
              f"), {median['faults']:,.0f} page faults, {median['huge_pages']:.0f} huge pages "
              "(medians)")


if __name__ == "__main__":
    main()
