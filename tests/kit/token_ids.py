"""A token-id corpus: one Megatron indexed dataset of 300 documents, each ending with id 2,
and a ``pretokenized`` recipe reading it (ids below 1,000, packed with ``wrap``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zephon.io.indexed import write_indexed_dataset


def token_id_recipe(directory: Path, top: str = "", tables: str = "") -> Path:
    """The corpus and its recipe in ``directory``; ``top`` adds top-level keys, ``tables``
    more tables."""
    rng = np.random.default_rng(0)
    prefix = write_indexed_dataset(directory / "web_text_document", [
        np.append(rng.integers(5, 900, size=int(rng.integers(10, 200))), 2) for _ in range(300)])
    path = directory / "ids.toml"
    path.write_text(f'seed = 1\n{top}[[datasets]]\nname = "web"\npath = "{prefix}"\n'
                    'fmt = "megatron"\n[tokenize]\nkind = "pretokenized"\nvocab_size = 1000\n'
                    f'[pack]\nalgorithm = "wrap"\n{tables}')
    return path
