"""Writes the MDS fixtures beside this file with Mosaic Streaming's own ``MDSWriter``:
``plain/`` (uncompressed shards), ``zstd/`` (zstd-compressed shards) and ``expected.jsonl``
(the same rows as JSON Lines, what a reader must return). Run once, by hand:

    python tests/data/mds/make_mds.py   # in an environment with mosaicml-streaming 0.13

``import streaming`` imports torchvision, which the project's CPU torch cannot load, so the
writer's package is entered below its top level (its writer needs numpy and the compressors
only).
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = {"text": "str", "id": "int", "tokens": "ndarray:int32", "raw": "bytes",
           "score": "float32", "meta": "json"}


def _writer():
    root = importlib.util.find_spec("streaming").submodule_search_locations[0]
    for name, sub in (("streaming", ""), ("streaming.base", "/base"),
                      ("streaming.base.format", "/base/format")):
        module = types.ModuleType(name)
        module.__path__ = [root + sub]
        sys.modules[name] = module
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter


def rows() -> list[dict]:
    rng = random.Random(7)
    words = ["data", "loader", "token", "shard", "lane", "mixture", "résumé", "naïve",
             "東京", "emoji 🙂", "packing", "epoch"]
    out = []
    for i in range(60):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))
        out.append({"text": text, "id": 1000 + i,
                    "tokens": [rng.randint(0, 30000) for _ in range(rng.randint(1, 12))],
                    "raw": text.encode()[:16].hex(), "score": round(rng.random(), 3),
                    "meta": {"source": "fixture", "n": i}})
    return out


def main() -> None:
    import numpy as np

    writer_class = _writer()
    data = rows()
    for folder, compression in (("plain", None), ("zstd", "zstd")):
        with writer_class(out=str(HERE / folder), columns=COLUMNS, compression=compression,
                          size_limit=1 << 12) as writer:
            for row in data:
                writer.write({**row, "tokens": np.array(row["tokens"], np.int32),
                              "raw": bytes.fromhex(row["raw"]),
                              "score": np.float32(row["score"])})
    with open(HERE / "expected.jsonl", "w", encoding="utf-8") as fh:
        for row in data:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
