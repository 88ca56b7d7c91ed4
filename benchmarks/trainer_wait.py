"""How long a training loop waits for data, when the loader has to keep up with it.

Measures the pipeline's capacity first (microbatches/s of ``tokenize -> pack_flat(2049) ->
batch(4) -> to_training``, a tight loop with the default read-ahead), with 1 rank and with 2
ranks (two gloo processes in step, a barrier per microbatch, the sum of their rates: on 2 cores
about 0.88x one rank's, the two tokenizer pools and loops sharing the cores), then runs a
simulated trainer at 25%, 50% and 80% of the capacity of the same number of ranks: per step it
holds the GIL for 2 ms (kernel launches) and sleeps the rest of the step (the GPU computing,
GIL released), taking one microbatch per step, with 1 rank and with 2 ranks (two gloo
processes, lanes 4, a barrier per step as gradient all-reduces impose). Prints, per run:
data-wait p50/p99/max after the first batch, the total wait as a share of wall time (after the
first batch), the time to the first and to the 10th batch from building the pipeline, the data
wait within those 10 batches (the 10th batch cannot come before 9 steps of the loop), and the
step-time inflation: the time from the first microbatch's arrival to the end against the
planned time of the steps, with a loader and without (rows ``none``: the loop alone, with
its barrier where there are two ranks). Building the pipeline and waiting for
the first microbatch (0.1-0.2 s, once a run, reported as ``first s``) are start-up, not step
time: counted in, they added 0.3-0.5 points to every row of a 400-step run.

Rows run at loads of the capacity of ``--rates-engine`` (``hf`` by default) with pipelines
that tokenize with ``--engine``, so engines compare at the same absolute data rates.

``--prefetch 0,4`` compares the thread layouts: the loader on the training loop's thread
(``prefetch=0``) or on its background thread, at the same step times.

Usage: ``python -m benchmarks.trainer_wait [--steps 400] [--docs 4000] [--workers N]
[--engine auto[,hf]] [--rates-engine hf] [--prefetch 4[,0]] [--loads 0.25,0.5,0.8]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUSY_S = 0.002


def pipeline_for(paths: dict[str, str], rank: int = 0, world: int = 1, prefetch: int = 4,
                 workers: int = 0, engine: str = "auto"):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("bench", paths["data"])], seed=0,
                                     repeat=True)
    return (Pipeline(source).options(lanes=4, dp_rank=rank, dp_world_size=world,
                                     prefetch=prefetch, workers=workers)
            .tokenize(tokenizer_id=paths["tokenizer"], engine=engine)
            .pack_flat(2049, "wrap").batch(4))


def capacity(paths: dict[str, str], batches: int, workers: int = 0, rank: int = 0,
             world: int = 1, port: int | None = None, engine: str = "auto",
             prefetch: int = 4) -> float:
    """Microbatches per second of a tight loop, read ahead as in training, after a warm-up
    of 100 (torch imported first, as a trainer has it). Long enough (1500 microbatches, 12M
    tokens, split between the ranks) that what the sources read ahead at the start (up to
    3 MiB of text per lane) is a small part of it: over 400 the capacity came out some 13%
    low. With ``world > 1`` this rank's rate, in step with its peers (a barrier per
    microbatch)."""
    import torch  # noqa: F401

    barrier = _join(rank, world, port)
    iterator = iter(pipeline_for(paths, rank, world, prefetch, workers, engine))
    for _ in range(100 // world):
        next(iterator).to_training(return_labels=True)
        barrier()
    start = time.perf_counter()
    for _ in range(batches // world):
        next(iterator).to_training(return_labels=True)
        barrier()
    return batches // world / (time.perf_counter() - start)


def _join(rank: int, world: int, port: int | None):
    """Join the gloo group of ``world`` ranks (through the store of the launching process,
    :func:`_run_ranks`; ``port`` is unused); returns its barrier (a no-op for one rank)."""
    if world == 1:
        return lambda: None
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    return dist.barrier


def trainer(paths: dict[str, str], step_s: float, steps: int, rank: int, world: int,
            port: int | None, workers: int = 0, loader: bool = True,
            engine: str = "auto", prefetch: int = 4) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    made: list = []
    if not loader:  # the reference loop: microbatches made beforehand, nothing running
        made = list(itertools.islice(pipeline_for(paths, prefetch=0), steps))
    barrier = _join(rank, world, port)
    start = time.perf_counter()
    iterator = iter(pipeline_for(paths, rank, world, prefetch, workers, engine) if loader
                    else made)
    waits, tenth, steady = [], None, 0.0
    for step in range(steps):
        asked = time.perf_counter()
        batch = next(iterator)
        waits.append(time.perf_counter() - asked)
        if step == 0:
            steady = time.perf_counter()
        batch.to_training(return_labels=True)
        if step == 9:
            tenth = time.perf_counter() - start
        busy = time.perf_counter() + BUSY_S
        while time.perf_counter() < busy:
            pass
        time.sleep(max(0.0, step_s - BUSY_S))
        barrier()
    end = time.perf_counter()
    after_first = waits[1:]
    return {"first_s": waits[0], "first10_wait_s": sum(waits[:10]),
            "p50_ms": 1000 * statistics.median(after_first),
            "p99_ms": 1000 * sorted(after_first)[int(0.99 * (len(after_first) - 1))],
            "max_ms": 1000 * max(after_first),
            "wait_share": sum(after_first) / (end - steady),
            "tenth_s": tenth or float("nan"),
            "inflation": (end - steady) / (step_s * steps) - 1}


def run_child(paths: dict[str, str], step_s: float, steps: int, world: int,
              workers: int = 0, loader: bool = True, engine: str = "auto",
              prefetch: int = 4) -> list[dict]:
    return _run_ranks(world, {"paths": paths, "step_s": step_s, "steps": steps,
                              "workers": workers, "loader": loader, "engine": engine,
                              "prefetch": prefetch})


def ranks_capacity(paths: dict[str, str], batches: int, world: int, workers: int = 0,
                   engine: str = "auto", prefetch: int = 4) -> float:
    """:func:`capacity` of ``world`` ranks in step, in processes of their own: the sum of
    their rates."""
    return sum(r["rate"] for r in _run_ranks(world, {"paths": paths, "capacity": batches,
                                                     "workers": workers, "engine": engine,
                                                     "prefetch": prefetch}))


def _run_ranks(world: int, spec: dict) -> list[dict]:
    from zephon.distributed import launcher_store

    _store, rendezvous = launcher_store(world)  # held until the ranks exit
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.trainer_wait", "--child",
                               json.dumps({**spec, "rank": r, "world": world, "port": None})],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **rendezvous, "OMP_NUM_THREADS": "1",
                                   "LOCAL_WORLD_SIZE": str(world)})  # as torchrun sets it
             for r in range(world)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--workers", type=int, default=0,
                        help="options(workers=N) of every pipeline, the capacity's included")
    parser.add_argument("--engine", default="auto",
                        help="tokenize engines of the trainers' pipelines, comma-separated "
                        "(auto, hf, fastokens): each row runs once per engine, side by side")
    parser.add_argument("--rates-engine", default="hf",
                        help="engine whose capacity sets the rows' data rates: with the "
                        "default, every engine is measured at the same absolute rates")
    parser.add_argument("--prefetch", default="4",
                        help="options(prefetch=N) of the trainers' pipelines, comma-separated "
                        "(0: the loader runs on the training loop's thread): each row runs "
                        "once per value, and the capacity is measured with each")
    parser.add_argument("--loads", default="0.25,0.5,0.8",
                        help="comma-separated loads (shares of the capacity) of the rows")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        if "capacity" in spec:
            print(json.dumps({"rate": capacity(spec["paths"], spec["capacity"], spec["workers"],
                                               spec["rank"], spec["world"], spec["port"],
                                               spec["engine"], spec.get("prefetch", 4))}))
            return
        print(json.dumps(trainer(spec["paths"], spec["step_s"], spec["steps"], spec["rank"],
                                 spec["world"], spec["port"], spec.get("workers", 0),
                                 spec.get("loader", True), spec.get("engine", "auto"),
                                 spec.get("prefetch", 4))))
        return
    from benchmarks.throughput import build_corpus

    paths = build_corpus(Path(args.root), args.docs, 8)
    engines = args.engine.split(",")
    prefetches = [int(x) for x in args.prefetch.split(",")]
    measured = {(engine, prefetch): {world: ranks_capacity(paths, 1500, world, args.workers,
                                                           engine, prefetch)
                                     for world in (1, 2)}
                for engine in dict.fromkeys((args.rates_engine, *engines))
                for prefetch in prefetches}
    for (engine, prefetch), by_world in measured.items():
        for world, rate in by_world.items():
            print(f"capacity, engine {engine}, prefetch {prefetch}, {world} "
                  f"rank{'s' if world > 1 else ''}: {rate:.1f} microbatches/s of 4 x 2049 "
                  f"tokens ({rate * 4 * 2049:,.0f} tokens/s), tight loop"
                  + (f", {rate / by_world[1]:.2f}x one rank's" if world > 1 else ""))
    rates = measured[args.rates_engine, prefetches[0]]
    print(f"rows: loads of engine {args.rates_engine}'s capacity (prefetch {prefetches[0]}); "
          f"trainers' pipelines use engine {', '.join(engines)}")
    print(f"{'load':>6}{'ranks':>7}{'engine':>11}{'prefetch':>9}{'step ms':>9}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'max ms':>9}{'wait %':>8}{'first s':>9}{'10th s':>8}{'wait<10':>9}"
          f"{'inflation':>11}")
    for load in (float(x) for x in args.loads.split(",")):
        for world, engine in itertools.product((1, 2), (None, *engines)):
            # Ranks share this machine's cores: each runs at the load of its share.
            step_s = 1 / (load * rates[world] / world)
            if engine is None:  # the loop alone: what the ranks' steps take without a loader
                bare = max(run_child(paths, step_s, args.steps, world, loader=False),
                           key=lambda r: r["inflation"])
                print(f"{load:>6.0%}{world:>7}{'none':>11}{'':>9}{1000 * step_s:>9.1f}{'':>9}"
                      f"{'':>9}{'':>9}{'':>8}{'':>9}{'':>8}{'':>9}"
                      f"{100 * bare['inflation']:>10.1f}%")
                continue
            for prefetch in prefetches:
                results = run_child(paths, step_s, args.steps, world, args.workers,
                                    engine=engine, prefetch=prefetch)
                worst = max(results, key=lambda r: r["wait_share"])
                print(f"{load:>6.0%}{world:>7}{engine:>11}{prefetch:>9}{1000 * step_s:>9.1f}"
                      f"{worst['p50_ms']:>9.2f}"
                      f"{worst['p99_ms']:>9.2f}{worst['max_ms']:>9.1f}"
                      f"{100 * worst['wait_share']:>7.2f}%{worst['first_s']:>9.2f}"
                      f"{worst['tenth_s']:>8.2f}{worst['first10_wait_s']:>9.2f}"
                      f"{100 * worst['inflation']:>10.1f}%")

if __name__ == "__main__":
    main()
