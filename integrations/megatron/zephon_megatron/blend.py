"""Megatron's own data flags with ``--dataloader zephon``: ``--data-path`` blends and ``--split``.

``--data-path 0.7 /data/web_text_document 0.3 /data/code_text_document`` (weights and indexed
dataset prefixes in turn) or ``--data-path /data/a /data/b`` (equal weights) becomes a Zephon
mixture over those indexed datasets, read with ``pretokenized`` (the ids as
``preprocess_data.py`` wrote them; add nothing, since ``--append-eod`` data already ends each
document with EOD). Mixing is by tokens, which is what Megatron's blend weights amount to (its
samples are fixed windows of ``--seq-length`` tokens), and every dataset repeats when it runs
out, as Megatron's epochs do.

``--split 969,30,1`` (Megatron's default with ``--data-path``) cuts each dataset's documents
into train, validation and test ranges the way Megatron's GPT builder cuts its sequences:
cumulative normalized weights times the count, rounded. For GPT data, which has one sequence
per document, the ranges are the same documents Megatron would use; for sentence-split data
Zephon keeps whole documents together (the one documented difference). Validation and test
read their ranges; an empty range gives no iterator.

A ``--zephon-recipe`` given with ``--data-path`` sets everything but the datasets (lanes,
packing, shuffle, ``[to_training] eos_token_id``, the EOD id ``--eod-mask-loss`` needs outside
Megatron-LM); it must not name ``[[datasets]]``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from zephon.errors import ConfigError
from zephon.recipe import DataRecipe, DatasetEntry, read_toml

DEFAULT_SPLIT = "969,30,1"
SPLITS = ("train", "valid", "test")


class BlendError(ConfigError):
    """``--data-path`` or ``--split`` cannot be read; the message says why."""


def parse_blend(values: Sequence[str]) -> list[tuple[float, str]]:
    """(weight, prefix) pairs from ``--data-path`` values, by Megatron's rule: an even count
    whose every other value is a number is weights and prefixes in turn; anything else is
    prefixes of equal weight."""
    values = list(values)
    if not values:
        raise BlendError("--data-path needs at least one dataset prefix")
    if len(values) % 2 == 0:
        weights = [_number(v) for v in values[0::2]]
        if all(w is not None for w in weights):
            pairs = list(zip(weights, values[1::2], strict=True))
            bad = [w for w, _ in pairs if w < 0]
            if bad or not any(w > 0 for w, _ in pairs):
                raise BlendError(f"--data-path weights must be >= 0 and not all 0, got "
                                 f"{[w for w, _ in pairs]}")
            return [(float(w), p) for w, p in pairs]  # type: ignore[arg-type]
        if any(w is not None for w in weights):
            raise BlendError("--data-path mixes weights and prefixes: give 'W1 P1 W2 P2 ...' "
                             f"or 'P1 P2 ...', got {values}")
    return [(1.0, p) for p in values]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def split_ranges(split: str, documents: int) -> list[tuple[int, int]]:
    """Train, validation and test document ranges of ``documents`` for a ``--split`` value."""
    parts = [float(p) for p in re.findall(r"[.0-9]+", split)]
    if not parts or len(parts) > 3 or not any(parts):
        raise BlendError(f"--split {split!r} is not up to three non-negative weights such as "
                         f"'{DEFAULT_SPLIT}'")
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    bounds = [0.0]
    for part in parts:
        bounds.append(bounds[-1] + part / total)
    cuts = [round(b * documents) for b in bounds]
    return [(cuts[i], cuts[i + 1]) for i in range(3)]


def blend_recipes(data_path: Sequence[str], split: str | None, options_recipe: str | None,
                  *, lanes: int | None, seed: int) -> dict[str, DataRecipe | None]:
    """The train/valid/test recipes of a ``--data-path`` run (None where a split is empty)."""
    from zephon.io.indexed import open_indexed, prefix_of

    blend = parse_blend(data_path)
    names: list[str] = []
    counts: list[int] = []
    for _, prefix in blend:
        if prefix_of(prefix) is None:
            raise BlendError(f"--data-path {prefix!r}: no {prefix}.idx and {prefix}.bin (the "
                             "prefix of a Megatron indexed dataset)")
        counts.append(open_indexed(prefix_of(prefix)).documents)  # type: ignore[arg-type]
        base = os.path.basename(prefix.rstrip("/")) or "data"
        names.append(base if base not in names else f"{base}-{len(names)}")
    options: dict[str, Any] = dict(read_toml(options_recipe)) if options_recipe else {}
    source = options_recipe or "--data-path"
    if options.get("datasets"):
        raise BlendError(f"{source}: [[datasets]] conflicts with --data-path, which names the "
                         "data; use a recipe without [[datasets]] for the other options")
    options.setdefault("tokenize", {"kind": "pretokenized"})
    if options["tokenize"].get("kind") != "pretokenized":
        raise BlendError(f"{source}: with --data-path the data is token ids; set [tokenize] "
                         "kind = \"pretokenized\" (or leave [tokenize] out)")
    options.setdefault("seed", seed)
    if lanes is not None:
        options.setdefault("lanes", lanes)
    options.setdefault("mixture", {"by": "tokens", "repeat": True})
    ranges = [split_ranges(split or DEFAULT_SPLIT, n) for n in counts]
    recipes: dict[str, DataRecipe | None] = {}
    for i, role in enumerate(SPLITS):
        entries = [DatasetEntry(name, prefix, weight, "megatron", list(r[i]))
                   for name, (weight, prefix), r in zip(names, blend, ranges, strict=True)
                   if r[i][1] > r[i][0]]
        if not entries:
            if role == "train":
                raise BlendError(f"--split {split or DEFAULT_SPLIT!r} leaves no training "
                                 f"documents in {[p for _, p in blend]}")
            recipes[role] = None
            continue
        base_dir = os.path.dirname(os.path.abspath(options_recipe)) if options_recipe else None
        recipes[role] = DataRecipe.from_dict(options, source=f"{source} ({role} split)",
                                             base_dir=base_dir, datasets=entries)
    return recipes
