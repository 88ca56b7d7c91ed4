"""Hugging Face Hub datasets: ``hf://`` paths read through a node-local shard cache.

- :mod:`~zephon.io.hub.path`: the path grammar and its errors.
- :mod:`~zephon.io.hub.layout`: which files form each configuration and split.
- :mod:`~zephon.io.hub.resolve`: pinning a revision to a commit and listing a split, once per
  node (once per job under torch.distributed).
- :mod:`~zephon.io.hub.client`: the Hub requests, through huggingface_hub.
- :mod:`~zephon.io.hub.retry`: which Hub failures the shared retry loop
  (:mod:`zephon.io.retry`) retries, and user-facing errors.
- The shard cache that holds the downloaded files is :mod:`zephon.io.cache`, shared with the
  object stores.
- :mod:`~zephon.io.hub.hub_dataset`: ``HubDataset``, what ``Dataset.from_path("hf://...")`` returns.

Only the path grammar is imported here; the rest needs the ``hf`` extra (huggingface_hub).
"""

from zephon.io.hub.path import GRAMMAR, SOURCES, HubPath, parse_hub_path

__all__ = ["GRAMMAR", "SOURCES", "HubPath", "parse_hub_path"]
