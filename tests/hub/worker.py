"""A separate process for the Hub tests: ``python -m tests.hub.worker <json>``.

Modes: ``pipeline`` reads a Hub dataset with a Pipeline (optionally as one rank of a gloo
process group, with ``prefetch`` microbatches read ahead on a thread) and writes what it read as
JSON; ``open`` downloads one shard into the cache
and then sleeps (the test kills it).
"""

from __future__ import annotations

import json
import signal
import sys
import time


def _pipeline(args: dict) -> dict:
    from tests.hub.hubdata import fast_options
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    if args.get("world", 1) > 1 and args.get("distributed"):
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{args['store']}",
                                rank=args["rank"], world_size=args["world"])
    dataset = Dataset.from_path("d", args["path"])
    source = StaticMixtureWorkSource([dataset], mixture=MixtureSpec({"d": 1.0}), seed=3)
    pipeline = (Pipeline(source)
                .options(io_options=fast_options(args["cache"], args.get("limit")),
                         lanes=args.get("lanes", 2), dp_rank=args.get("rank", 0),
                         dp_world_size=args.get("world", 1),
                         prefetch=args.get("prefetch", 0))
                .batch(microbatch_size=4, drop_last=False))
    ids = [record.payload["id"] for batch in pipeline for record in batch.records]
    out = {"commit": dataset.commit, "ids": ids, "fingerprint": pipeline.fingerprint(),
           "downloads": pipeline.loader().source.datasets[0].cache.stats.downloads}
    if args.get("world", 1) > 1 and args.get("distributed"):
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return out


def _open(args: dict) -> None:
    from tests.hub.hubdata import fast_options
    from zephon.io import Dataset

    dataset = Dataset.from_path("d", args["path"])
    dataset.bind(fast_options(args["cache"], args.get("limit")))
    with dataset.local_file(dataset.files()[args.get("file", 0)]):
        pass
    time.sleep(60)


def main() -> None:
    # The Ctrl-C test interrupts this process. A shell without job control starts background
    # commands with SIGINT ignored, children inherit that, and Python then raises no
    # KeyboardInterrupt: take Ctrl-C as an interactive run does, however the tests were started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = json.loads(sys.argv[1])
    if args["mode"] == "pipeline":
        result = _pipeline(args)
        with open(args["out"], "w") as fh:
            json.dump(result, fh)
    elif args["mode"] == "open":
        _open(args)


if __name__ == "__main__":
    main()
