"""Start-up at scale: one rank lists and plans, every rank starts about as fast as one.

For each file count (``--files``, default 1,000, 10,000 and 100,000 local Parquet files of
one row group each, built once under ``--root``) and each data-parallel size (``--worlds``,
default 1, 4 and 8 real processes under gloo, rendezvous on a TCP store as torchrun's), it
prints:

- ``first@0`` and ``first@others``: seconds from constructing the Pipeline to the first
  microbatch at rank 0, and the slowest of the other ranks;
- ``plan MB``: the largest rank's plan: its listing (the ``DataFile`` objects and their
  strings) and its unit tables;
- ``loader MB``: the growth of the largest rank's RSS from before the Pipeline to its first
  microbatch (plan, lanes, readers and their buffers), after a warm-up pipeline over one
  file has loaded the tokenizer and the readers;
- ``opens``: opens of the dataset's files by the whole job (inotify,
  :mod:`benchmarks.open_counter`), and per file.

Then the same over ``s3://`` (``--objects``, default 2,000 of the same files, on moto's S3
server in a process of its own, :mod:`benchmarks.object_store`), each rank with its own cache
root as ranks on separate nodes have. In place of opens it prints what the server answered for
the whole job: LIST and HEAD requests, ranged GETs (footers) and whole-object GETs with their MB.

Then it simulates jobs of 8, 64 and 1,024 ranks in one process over the largest file count:
for each, the plan is built once (8 lanes a rank), and each simulated rank picks the first
unit of each of its lanes; it prints the plan's build time and size, and the time and memory
of one rank's selection, which must not grow with the ranks.

Usage: ``python -m benchmarks.startup_scale [--files 1000,10000,100000] [--worlds 1,4,8]
[--objects 2000]`` (``--objects 0``: no S3 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.open_counter import OpenCounter

LANES_PER_RANK = 8


def build_files(root: Path, count: int) -> Path:
    """``count`` small Parquet files (one row group of 4 documents each), built once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / f"files-{count}"
    done = folder / ".done"
    if done.exists():
        return folder / "data"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(count):
        texts = [f"file {i} document {j} " + "some words of text " * (4 + (i + j) % 9)
                 for j in range(4)]
        pq.write_table(pa.table({"text": texts}), data / f"part-{i:06d}.parquet")
        if (i + 1) % 20_000 == 0:
            print(f"  wrote {i + 1:,} of {count:,} files "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    done.write_text("")
    return data


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(rank: int, world: int, data: str, tokenizer: str, lanes: int, out: str,
           warm_file: str, cache: str) -> None:
    import torch.distributed as dist

    from zephon import Pipeline
    from zephon.io import CacheOptions, Dataset, StoreOptions
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    one_file = warm_file
    warm = (Pipeline(StaticMixtureWorkSource([Dataset.from_path("warm", one_file)],
                                             MixtureSpec({"warm": 1.0}), seed=1))
            .options(lanes=1, prefetch=0).tokenize(tokenizer_id=tokenizer).pack_flat(129)
            .batch(1))
    next(iter(warm))
    del warm
    before = rss_bytes()
    started = time.perf_counter()
    source = StaticMixtureWorkSource([Dataset.from_path("web", data)],
                                     MixtureSpec({"web": 1.0}), seed=1)
    io = StoreOptions(cache=CacheOptions(enabled=True, root=f"{cache}/rank{rank}"),
                      show_progress=False) if cache else None
    pipeline = (Pipeline(source).options(io, lanes=lanes, dp_rank=rank, dp_world_size=world,
                                         prefetch=0)
                .tokenize(tokenizer_id=tokenizer).pack_flat(129).batch(2))
    next(iter(pipeline))
    first = time.perf_counter() - started
    grown = rss_bytes() - before
    planned = pipeline.loader().source  # the source bound to the cache, as the lanes read it
    files = planned.datasets[0].files()
    plan = sum(t.nbytes for t in planned.plan(lanes)) + sum(
        sys.getsizeof(f) + sys.getsizeof(f.path) + sys.getsizeof(f.version) for f in files)
    Path(out).write_text(json.dumps({"first": first, "rss": grown, "plan": plan}))
    if world > 1:
        dist.destroy_process_group()


def run_job(world: int, data: Path, tokenizer: str, tmp: Path,
            remote: str = "") -> dict[str, float]:
    """One job of ``world`` ranks over the local files ``data``, or over ``remote`` (their
    copies in an object store, one cache root a rank)."""
    from zephon.distributed import launcher_store

    store, variables = launcher_store(world)
    outs = [tmp / f"rank{r}.json" for r in range(world)]
    cache = str(tmp / f"cache-{time.time_ns()}") if remote else ""
    warm_file = str(min(data.iterdir()))
    counter = OpenCounter(data)
    try:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "benchmarks.startup_scale", "--worker", str(r), str(world),
             remote or str(data), tokenizer, str(LANES_PER_RANK * 8), str(outs[r]), warm_file,
             cache],
            env={**os.environ, **variables, "RANK": str(r)}) for r in range(world)]
        while any(p.poll() is None for p in procs):
            counter.drain()
            time.sleep(0.02)
        opens = counter.drain()
    finally:
        counter.close()
        del store
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed at W={world}")
    results = [json.loads(o.read_text()) for o in outs]
    return {"first0": results[0]["first"],
            "first_others": max((r["first"] for r in results[1:]), default=float("nan")),
            "rss": max(r["rss"] for r in results), "plan": max(r["plan"] for r in results),
            "opens": opens}


def s3_rows(root: Path, count: int, worlds: list[int], tokenizer: str, tmp: Path) -> None:
    """The jobs of :func:`run_job` over ``count`` objects on moto, and what moto answered."""
    import boto3

    from benchmarks.object_store import KEY_ID, REGION, SECRET, request_counts, start_server

    data = build_files(root, count)
    server, endpoint = start_server()
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                          aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
        s3.create_bucket(Bucket="bench")
        for f in sorted(data.iterdir()):
            s3.upload_file(str(f), "bench", f"data/{f.name}")
        os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID=KEY_ID,
                          AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION)
        request_counts(server)
        print(f"\n{count:,} objects on s3:// (moto), one cache root a rank:")
        print(f"{'objects':>8}{'W':>4}{'first@0 s':>11}{'first@others s':>16}{'plan MB':>9}"
              f"{'loader MB':>11}{'LISTs':>7}{'HEADs':>7}{'ranged GETs':>13}{'GETs':>7}"
              f"{'GET MB':>8}")
        for world in worlds:
            r = run_job(world, data, tokenizer, tmp, remote="s3://bench/data/*.parquet")
            seen = request_counts(server)
            print(f"{count:>8,}{world:>4}{r['first0']:>11.2f}{r['first_others']:>16.2f}"
                  f"{r['plan'] / 1e6:>9.1f}{r['rss'] / 1e6:>11.1f}{seen.get('list', 0):>7,}"
                  f"{seen.get('head', 0):>7,}{seen.get('range', 0):>13,}{seen.get('get', 0):>7,}"
                  f"{seen.get('get_bytes', 0) / 1e6:>8.1f}", flush=True)
    finally:
        server.stdin.close()
        server.terminate()
        server.wait()


def simulate(data: Path, ranks: list[int]) -> None:
    """For each job size: the plan built once, then one simulated rank's lane selection."""
    import tracemalloc

    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    print(f"\nsimulated jobs over {data.parent.name}:")
    print(f"{'ranks':>7}{'lanes':>7}{'plan s':>8}{'units':>10}{'table MB':>10}"
          f"{'us/rank':>9}{'KB/rank':>9}")
    for world in ranks:
        source = StaticMixtureWorkSource([Dataset.from_path("web", str(data))],
                                         MixtureSpec({"web": 1.0}), seed=1)
        lanes = world * LANES_PER_RANK
        started = time.perf_counter()
        table = source.plan(lanes)[0]
        planned = time.perf_counter() - started
        source.unit_at(0, 0, 0, lanes)  # the epoch's unit order, computed once per job
        sampled = range(0, world, max(1, world // 64))  # up to 64 ranks timed
        tracemalloc.start()
        started = time.perf_counter()
        for rank in sampled:
            picked = [source.unit_at(0, lane, 0, lanes) for lane in range(rank, lanes, world)]
            del picked
        elapsed = (time.perf_counter() - started) / len(sampled)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{world:>7}{lanes:>7}{planned:>8.2f}{len(table):>10,}{table.nbytes / 1e6:>10.1f}"
              f"{elapsed * 1e6:>9.0f}{peak / 1e3:>9.1f}", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, world, data, tokenizer, lanes, out, warm_file, cache = sys.argv[2:10]
        worker(int(rank), int(world), data, tokenizer, int(lanes), out, warm_file, cache)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="1000,10000,100000")
    parser.add_argument("--worlds", default="1,4,8")
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--simulate", default="8,64,1024")
    parser.add_argument("--root", type=Path, default=Path.home() / ".cache" / "zephon-bench")
    args = parser.parse_args()
    from zephon.demo.assets import build_demo_assets

    tokenizer = build_demo_assets()["tokenizer"]
    counts = [int(c) for c in args.files.split(",")]
    worlds = [int(w) for w in args.worlds.split(",")]
    tmp = args.root / "startup-scale-run"
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"{'files':>8}{'W':>4}{'first@0 s':>11}{'first@others s':>16}{'plan MB':>9}"
          f"{'loader MB':>11}{'opens':>9}{'per file':>10}")
    for count in counts:
        data = build_files(args.root, count)
        for world in worlds:
            r = run_job(world, data, tokenizer, tmp)
            print(f"{count:>8,}{world:>4}{r['first0']:>11.2f}{r['first_others']:>16.2f}"
                  f"{r['plan'] / 1e6:>9.1f}{r['rss'] / 1e6:>11.1f}{r['opens']:>9,}"
                  f"{r['opens'] / count:>10.2f}",
                  flush=True)
    if args.objects:
        s3_rows(args.root, args.objects, worlds, tokenizer, tmp)
    simulate(build_files(args.root, counts[-1]), [int(w) for w in args.simulate.split(",")])


if __name__ == "__main__":
    main()
