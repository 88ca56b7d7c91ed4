"""Test data for the Hub tests: file contents and the datasets of the seed README's table."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from zephon.demo.assets import make_documents
from zephon.io import CacheOptions, StoreOptions


def parquet_bytes(texts: list[str], row_group_size: int = 16, prefix: str = "") -> bytes:
    """A Parquet file with columns ``text`` and ``id`` (``{prefix}{row}``)."""
    out = io.BytesIO()
    table = pa.table({"text": texts, "id": [f"{prefix}{i}" for i in range(len(texts))]})
    pq.write_table(table, out, row_group_size=row_group_size)
    return out.getvalue()


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def readme(card: dict | None, body: str = "# Dataset\n") -> bytes:
    if card is None:
        return body.encode()
    return f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n{body}".encode()


def docs(n: int, seed: int, words: tuple[int, int] = (20, 80)) -> list[str]:
    return make_documents(n, seed=seed, min_words=words[0], max_words=words[1])


def sharded(texts: list[str], shards: int, pattern: str, row_group_size: int = 16
            ) -> dict[str, bytes]:
    """``texts`` in ``shards`` Parquet files named ``pattern.format(i=..., n=...)``."""
    per = -(-len(texts) // shards)
    return {pattern.format(i=i, n=shards): parquet_bytes(texts[i * per:(i + 1) * per],
                                                         row_group_size, prefix=f"{i}:")
            for i in range(shards)}


FINEWEB_CARD = {
    "license": "odc-by",
    "configs": [
        {"config_name": "default", "default": True,
         "data_files": [{"split": "train", "path": "data/*/*"}]},
        {"config_name": "sample-10BT", "data_files": [{"split": "train", "path": "sample/10BT/*"}]},
        {"config_name": "CC-MAIN-2024-10",
         "data_files": [{"split": "train", "path": "data/CC-MAIN-2024-10/*"}]},
    ],
}

WIKIPEDIA_CARD = {
    "configs": [
        {"config_name": "20231101.en", "data_files": [{"split": "train",
                                                       "path": "20231101.en/train-*"}]},
        {"config_name": "20231101.fr", "data_files": [{"split": "train",
                                                       "path": "20231101.fr/train-*"}]},
    ],
}


def seed_datasets(hub, shards: int = 4) -> dict[str, dict]:
    """The datasets of the seed README (fineweb-edu with a v1.4.0 branch, alpaca-cleaned as
    one JSON array plus its Parquet conversion, wikipedia with two configs). Returns, per repo,
    the texts of each split that a path reads, by revision."""
    sample = docs(160, seed=1)
    sample_v14 = docs(96, seed=2)
    crawl = docs(64, seed=3)
    files = {"README.md": readme(FINEWEB_CARD)}
    files.update(sharded(sample, shards, "sample/10BT/{i:03d}_00000.parquet"))
    files.update(sharded(crawl, 2, "data/CC-MAIN-2024-10/{i:03d}_00000.parquet"))
    hub.create("HuggingFaceFW/fineweb-edu", files)
    v14 = sharded(sample_v14, shards, "sample/10BT/{i:03d}_00000.parquet")
    hub.push("HuggingFaceFW/fineweb-edu", v14, branch="v1.4.0")

    alpaca = docs(80, seed=4, words=(10, 40))
    rows = [{"instruction": t[:30], "input": "", "output": t, "text": t} for t in alpaca]
    hub.create("yahma/alpaca-cleaned", {"README.md": readme({"license": "cc-by-4.0"}),
                                         "alpaca_data_cleaned.json": json.dumps(rows).encode()})
    hub.convert("yahma/alpaca-cleaned", {
        "default/train/0000.parquet": parquet_bytes(alpaca[:50], 8),
        "default/train/0001.parquet": parquet_bytes(alpaca[50:], 8)})

    wiki_en = docs(120, seed=5, words=(60, 200))
    wiki_fr = docs(40, seed=6)
    files = {"README.md": readme(WIKIPEDIA_CARD)}
    files.update(sharded(wiki_en, shards, "20231101.en/train-{i:05d}-of-{n:05d}.parquet"))
    files.update(sharded(wiki_fr, 2, "20231101.fr/train-{i:05d}-of-{n:05d}.parquet"))
    hub.create("wikimedia/wikipedia", files)
    return {"fineweb": {"main": sample, "v1.4.0": sample_v14, "crawl": crawl},
            "alpaca": alpaca, "wikipedia": {"20231101.en": wiki_en, "20231101.fr": wiki_fr}}


def fast_options(root, limit_bytes: int | None = 1 << 30, **store) -> StoreOptions:
    """Store options with a cache under ``root`` and retries that wait milliseconds."""
    defaults = {"retry_base_wait_s": 0.01, "retry_max_wait_s": 0.05, "max_retries": 3,
                "show_progress": False}
    defaults.update(store)
    cache = CacheOptions(enabled=True, root=str(root), limit_bytes=limit_bytes,
                         space_wait_s=5.0)
    return StoreOptions(cache=cache, **defaults)
