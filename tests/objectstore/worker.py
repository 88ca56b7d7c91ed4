"""A separate process for the object-store tests: ``python -m tests.objectstore.worker
<json>``. It reads ``path`` with a Pipeline (two lanes, ``prefetch`` microbatches ahead on a
thread) through the shard cache at ``cache`` and writes the ids it read and its cache's
download count as JSON to ``out``. Credentials and endpoint come from the environment."""

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

    source = StaticMixtureWorkSource([Dataset.from_path("d", args["path"])],
                                     mixture=MixtureSpec({"d": 1.0}), seed=3, repeat=False)
    pipeline = (Pipeline(source)
                .options(io_options=fast_options(args["cache"]), lanes=2,
                         prefetch=args.get("prefetch", 0))
                .batch(microbatch_size=4, drop_last=False))
    ids = [record.payload["id"] for batch in pipeline for record in batch.records]
    stats = pipeline.loader().source.datasets[0].cache.stats
    with open(args["out"], "w") as fh:
        json.dump({"ids": ids, "downloads": stats.downloads,
                   "downloaded_bytes": stats.downloaded_bytes}, fh)


if __name__ == "__main__":
    main()
