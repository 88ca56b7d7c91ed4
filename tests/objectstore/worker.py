"""A separate process for the object-store tests: ``python -m tests.objectstore.worker
<json>``. It reads ``path`` with a Pipeline (``lanes`` lanes, ``prefetch`` microbatches ahead
on a thread) through the shard cache at ``cache``, as rank ``rank`` of ``world`` gloo
processes when ``world`` > 1, and writes the ids it read (all, and by microbatch) and its
cache's downloads as JSON to ``out``. Credentials and endpoint come from the environment."""

from __future__ import annotations

import json
import signal
import sys


def main() -> None:
    # Take Ctrl-C as an interactive run does, however the tests were started (a shell
    # without job control starts background commands with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = json.loads(sys.argv[1])
    from tests.hub.hubdata import fast_options
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    world, rank = args.get("world", 1), args.get("rank", 0)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{args['store']}", rank=rank,
                                world_size=world)
    source = StaticMixtureWorkSource([Dataset.from_path("d", args["path"])],
                                     mixture=MixtureSpec({"d": 1.0}), seed=3, repeat=False)
    pipeline = (Pipeline(source)
                .options(io_options=fast_options(args["cache"]), lanes=args.get("lanes", 2),
                         prefetch=args.get("prefetch", 0), dp_rank=rank, dp_world_size=world)
                .batch(microbatch_size=4, drop_last=False))
    ids, batches = [], {}
    for batch in pipeline:
        batches[f"{batch.lane}/{batch.index}"] = [r.payload["id"] for r in batch.records]
        ids += batches[f"{batch.lane}/{batch.index}"]
    stats = pipeline.loader().source.datasets[0].cache.stats
    with open(args["out"], "w") as fh:
        json.dump({"ids": ids, "batches": batches, "downloads": stats.downloads,
                   "downloaded_bytes": stats.downloaded_bytes}, fh)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
