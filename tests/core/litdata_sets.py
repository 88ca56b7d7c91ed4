"""LitData datasets for the tests, written by LitData's own ``litdata.optimize`` (the dev
setup installs it): the same 40 items, plain and at each zstd level LitData writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VARIANTS = {"plain": {}, "batch": {"compression": "zstd"},
            "chunk": {"compression": "zstd", "compression_level": "chunk"},
            "sample": {"compression": "zstd", "compression_level": "sample"}}
"""``optimize`` options by variant: no compression, and zstd by frames of items (LitData's
default), over the whole chunk file (``*.zstd.bin``) and item by item."""
ITEMS = 40


def item(i: int) -> dict:
    """Item ``i``: text and every kind of leaf the reader decodes (imported by the
    optimize worker, so it lives in a module)."""
    words = " ".join(f"word{(i * 7 + k) % 13}" for k in range(3 + i % 9))
    return {"text": f"item {i}: {words}.", "id": i,
            "tokens": np.arange(i % 6 + 1, dtype=np.int32) * (i + 1),
            "score": i / 8, "flag": i % 3 == 0, "raw": bytes([i, 255 - i])}


def build(root: Path, variant: str) -> Path:
    """The variant's dataset folder under ``root`` (written once)."""
    from litdata import optimize

    out = root / variant
    if not (out / "index.json").exists():
        optimize(fn=item, inputs=list(range(ITEMS)), output_dir=str(out), chunk_bytes="1KB",
                 num_workers=1, mode="overwrite", **VARIANTS[variant])
        chunks = json.loads((out / "index.json").read_text())["chunks"]
        assert sum(c["chunk_size"] for c in chunks) == ITEMS and len(chunks) >= 3, chunks
    return out


def chat_item(i: int) -> dict:
    """Item ``i`` with a nested value, which LitData keeps as Arrow rows after the chunk."""
    return {"text": f"chat {i}",
            "messages": [{"role": "user", "content": f"question {i}"},
                         {"role": "assistant", "content": f"answer {i} " + "x" * (i % 4)}],
            "n": i}


def written(root: Path, name: str, make, items: int) -> Path:
    """A dataset of ``make(i)`` for ``i`` below ``items``, written once under ``root/name`` by
    LitData's ``BinaryWriter`` (what ``optimize`` runs in its workers), 5 items a chunk."""
    from litdata.streaming.writer import BinaryWriter

    out = root / name
    if not (out / "index.json").exists():
        writer = BinaryWriter(str(out), chunk_size=5)
        for i in range(items):
            writer[i] = make(i)
        writer.done()
        writer.merge()
    return out


def build_chat(root: Path, items: int = 23) -> Path:
    """A dataset of :func:`chat_item` rows."""
    return written(root, "chat", chat_item, items)


def text_item(i: int) -> dict:
    """Item ``i`` of text and a number, which LitData keeps only as Arrow rows after the
    chunk's header (its items hold no bytes)."""
    return {"text": f"text {i} " + "w" * (i % 7), "n": i}


def build_text(root: Path, items: int = 12) -> Path:
    """A dataset of :func:`text_item` rows."""
    return written(root, "text", text_item, items)
