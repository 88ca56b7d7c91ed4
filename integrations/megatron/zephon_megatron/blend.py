"""Megatron's own data flags with ``--dataloader zephon``: ``--data-path`` blends and ``--split``.

``--data-path 0.7 /data/web_text_document 0.3 /data/code_text_document`` (weights and indexed
dataset prefixes in turn) or ``--data-path /data/a /data/b`` (no weights) becomes a Zephon
mixture over those indexed datasets, read with ``pretokenized`` (the ids as
``preprocess_data.py`` wrote them; add nothing, since ``--append-eod`` data already ends each
document with EOD). Mixing is by tokens, which is what Megatron's blend weights amount to (its
samples are fixed windows of ``--seq-length`` tokens), and every dataset repeats when it runs
out, as Megatron's epochs do.

Prefixes without weights are weighted by size, as Megatron's ``BlendedMegatronDatasetBuilder``
does when the blend has no weights: each dataset's weight in a split is the length of its
one-epoch ``GPTDataset`` there, ``(tokens of the split's sequences - 1) // --seq-length``
(the samples of ``seq_length + 1`` tokens one epoch holds). A dataset too small for one sample
in a split gets no share of it. With one prefix there is nothing to weigh.

``--split 969,30,1`` (Megatron's default with ``--data-path``) cuts each dataset's documents
into train, validation and test ranges the way Megatron's GPT builder cuts its sequences:
cumulative normalized weights times the count, rounded. For GPT data, which has one sequence
per document, the ranges are the same documents Megatron would use; for sentence-split data
Zephon keeps whole documents together (the one documented difference; the size weights still
count Megatron's sequence ranges). Validation and test read their ranges; an empty range gives
no iterator.

Megatron's blend files mean what they mean there: ``--data-args-path FILE`` holds the
``--data-path`` values as text (split on whitespace), and ``--per-split-data-args-path FILE``
is a JSON object with ``"train"``, ``"valid"`` and ``"test"`` blends (each a list of values or
one whitespace-separated string, or null for none), read whole, without ``--split``, as
``--train-data-path``/``--valid-data-path``/``--test-data-path`` would give them.

A ``--zephon-recipe`` given with ``--data-path`` sets everything but the datasets (lanes,
packing, shuffle, ``[to_training] eos_token_id``, the EOD id ``--eod-mask-loss`` needs outside
Megatron-LM); it must not name ``[[datasets]]``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.recipe import DataRecipe, DatasetEntry, read_toml
from zephon_megatron.preset import MEGATRON

DEFAULT_SPLIT = "969,30,1"
SPLITS = ("train", "valid", "test")
WHOLE = "1,0,0"
"""The split of a per-split blend: each of its datasets is read whole."""


class BlendError(ConfigError):
    """``--data-path``, a blend file or ``--split`` cannot be read; the message says why."""


def parse_blend(values: Sequence[str], flag: str = "--data-path"
                ) -> list[tuple[float | None, str]]:
    """(weight, prefix) pairs from ``--data-path`` values, by Megatron's rule
    (``get_blend_from_list``): an even count whose every other value is a number is weights
    and prefixes in turn; anything else is prefixes without weights (weight None: weighted by
    size, see :func:`sample_counts`)."""
    values = list(values)
    if not values:
        raise BlendError(f"{flag} needs at least one dataset prefix")
    if len(values) % 2 == 0:
        weights = [_number(v) for v in values[0::2]]
        if all(w is not None for w in weights):
            pairs = list(zip(weights, values[1::2], strict=True))
            bad = [w for w, _ in pairs if w < 0]
            if bad or not any(w > 0 for w, _ in pairs):
                raise BlendError(f"{flag} weights must be >= 0 and not all 0, got "
                                 f"{[w for w, _ in pairs]}")
            return [(float(w), p) for w, p in pairs]  # type: ignore[arg-type]
        if any(w is not None for w in weights):
            raise BlendError(f"{flag} mixes weights and prefixes: give 'W1 P1 W2 P2 ...' "
                             f"or 'P1 P2 ...', got {values}")
    return [(None, p) for p in values]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_data_args(path: str) -> list[str]:
    """The ``--data-path`` values a ``--data-args-path`` file holds: its text split on
    whitespace, as Megatron-LM reads it."""
    try:
        with open(path) as f:
            values = f.read().split()
    except OSError as exc:
        raise BlendError(f"--data-args-path {path!r}: cannot read it ({exc.strerror})") from None
    if not values:
        raise BlendError(f"--data-args-path {path!r} is empty; it should hold the --data-path "
                         "values, e.g. '0.7 /data/web_text_document 0.3 /data/code_document'")
    return values


def read_per_split_data_args(path: str) -> dict[str, list[str] | None]:
    """The train/valid/test blends of a ``--per-split-data-args-path`` JSON file, as
    Megatron-LM reads it: every key must be there; a string value is split on whitespace; a
    null or empty value gives that split no data."""
    where = f"--per-split-data-args-path {path!r}"
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as exc:
        raise BlendError(f"{where}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise BlendError(f"{where}: not JSON ({exc})") from None
    missing = [s for s in SPLITS if not isinstance(raw, dict) or s not in raw]
    if missing:
        raise BlendError(f"{where} needs the keys {list(SPLITS)} (Megatron reads all three; "
                         f"null for a split without data), missing {missing}")
    blends: dict[str, list[str] | None] = {}
    for role in SPLITS:
        value = raw[role]
        if isinstance(value, str):
            value = value.split()
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise BlendError(f"{where}: {role!r} must be a list of strings (weights and "
                             f"prefixes, as --data-path takes them) or one string, got {value!r}")
        blends[role] = list(value) if value else None
    if not blends["train"]:
        raise BlendError(f"{where}: 'train' names no dataset")
    return blends


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


def sample_counts(dataset: Any, split: str, seq_length: int) -> list[int]:
    """Megatron's weight of an unweighted prefix in the train, validation and test split: the
    length of its one-epoch GPTDataset there, ``(tokens - 1) // seq_length`` over the split's
    range of *sequences* (0 for an empty range)."""
    lengths = np.asarray(dataset.lengths, dtype=np.int64)
    totals = np.concatenate([[0], np.cumsum(lengths)])
    counts = []
    for begin, end in split_ranges(split, len(lengths)):
        tokens = int(totals[end] - totals[begin])
        counts.append(max(0, (tokens - 1) // seq_length))
    return counts


def _open_prefixes(blend: list[tuple[float | None, str]], flag: str) -> list[Any]:
    from zephon.io.indexed import open_indexed, prefix_of

    datasets = []
    for _, prefix in blend:
        if prefix_of(prefix) is None:
            raise BlendError(f"{flag} {prefix!r}: no {prefix}.idx and {prefix}.bin (the "
                             "prefix of a Megatron indexed dataset)")
        datasets.append(open_indexed(prefix_of(prefix)))  # type: ignore[arg-type]
    return datasets


def _names(blend: list[tuple[float | None, str]]) -> list[str]:
    names: list[str] = []
    for _, prefix in blend:
        base = os.path.basename(prefix.rstrip("/")) or "data"
        names.append(base if base not in names else f"{base}-{len(names)}")
    return names


def blend_entries(blend: list[tuple[float | None, str]], split: str, seq_length: int,
                  flag: str = "--data-path") -> dict[str, list[DatasetEntry]]:
    """The datasets of each split (train, valid, test) of one blend cut by ``split``: given
    weights as they are, missing ones by size (:func:`sample_counts`); a dataset whose range
    is empty, or too small for one sample when weighed by size, is left out of that split.

    Each entry names the ``.idx`` file, not the prefix: Megatron-LM without
    ``--data-cache-path`` writes its index cache into a directory named like the prefix
    (``PREFIX/cache/GPTDataset_indices``), which a prefix path would list instead."""
    datasets = _open_prefixes(blend, flag)
    weigh = len(blend) > 1
    entries: dict[str, list[DatasetEntry]] = {role: [] for role in SPLITS}
    for name, (weight, _), dataset in zip(_names(blend), blend, datasets, strict=True):
        ranges = split_ranges(split, dataset.documents)
        sizes = sample_counts(dataset, split, seq_length) if weight is None and weigh else None
        for i, role in enumerate(SPLITS):
            share = weight if weight is not None else (sizes[i] if sizes else 1.0)
            if ranges[i][1] > ranges[i][0] and share > 0:
                entries[role].append(DatasetEntry(name, dataset.prefix + ".idx", float(share),
                                                  "megatron", list(ranges[i])))
    return entries


def per_split_entries(blends: Mapping[str, Sequence[str] | None],
                      seq_length: int) -> dict[str, list[DatasetEntry]]:
    """The datasets of each split of a per-split blend: each split's blend read whole."""
    entries: dict[str, list[DatasetEntry]] = {}
    for role in SPLITS:
        values = blends.get(role)
        flag = f"--per-split-data-args-path [{role!r}]"
        entries[role] = (blend_entries(parse_blend(values, flag), WHOLE, seq_length,
                                       flag)["train"] if values else [])
    return entries


_BLENDS: dict[tuple[Any, ...], dict[str, DataRecipe | None]] = {}


def blend_recipes(data_path: Sequence[str] | None, split: str | None,
                  options_recipe: str | None, *, lanes: int | None, seed: int,
                  seq_length: int, per_split: Mapping[str, Sequence[str] | None] | None = None
                  ) -> dict[str, DataRecipe | None]:
    """The train/valid/test recipes of a ``--data-path`` run, or of a per-split blend
    (``per_split``; ``data_path`` and ``split`` unused); None where a split has no data.

    Made once per process for the same flags (and unchanged options recipe and ``.idx``
    files): the entry, the preflight, the provider and the loss all ask for them, and each
    making reads every index and lists every dataset."""
    key = (tuple(data_path or ()), split, _file_key(options_recipe), seed, seq_length,
           None if per_split is None else tuple(sorted(
               (role, tuple(blend or ())) for role, blend in per_split.items())))
    prefixes = [value for value in key[0] if not _is_number(value)] + [
        value for _, blend in (key[-1] or ()) for value in blend if not _is_number(value)]
    key += tuple(_file_key(f"{prefix}.idx") for prefix in prefixes)
    if key not in _BLENDS:
        _BLENDS[key] = _blend_recipes(data_path, split, options_recipe, seed=seed,
                                      seq_length=seq_length, per_split=per_split)
    return {role: recipe if recipe is None or lanes is None or recipe.lanes is not None
            else dataclasses.replace(recipe, lanes=lanes)
            for role, recipe in _BLENDS[key].items()}


def _file_key(path: str | None) -> tuple[Any, ...] | None:
    """(path, size, modification time) of a file, or None (no file: not kept apart)."""
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return (path,)
    return (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _blend_recipes(data_path: Sequence[str] | None, split: str | None,
                   options_recipe: str | None, *, seed: int,
                   seq_length: int, per_split: Mapping[str, Sequence[str] | None] | None
                   ) -> dict[str, DataRecipe | None]:
    if per_split is not None:
        entries = per_split_entries(per_split, seq_length)
        described = "--per-split-data-args-path"
    else:
        blend = parse_blend(data_path or [])
        entries = blend_entries(blend, split or DEFAULT_SPLIT, seq_length)
        described = "--data-path"
    options: dict[str, Any] = dict(read_toml(options_recipe)) if options_recipe else {}
    source = options_recipe or described
    if options.get("datasets"):
        raise BlendError(f"{source}: [[datasets]] conflicts with {described}, which names the "
                         "data; use a recipe without [[datasets]] for the other options")
    if isinstance(options.get("mixture"), dict) and "stages" in options["mixture"]:
        raise BlendError(f"{source}: [[mixture.stages]] conflicts with {described}, whose "
                         "weights are a fixed blend as in Megatron; for shares that change "
                         "during the run, name the datasets in a --zephon-recipe with "
                         "[[datasets]] and [[mixture.stages]] instead of the data flags")
    options.setdefault("tokenize", {"kind": "pretokenized"})
    if options["tokenize"].get("kind") != "pretokenized":
        raise BlendError(f"{source}: with {described} the data is token ids; set [tokenize] "
                         "kind = \"pretokenized\" (or leave [tokenize] out)")
    options.setdefault("seed", seed)
    options.setdefault("mixture", {"by": "tokens", "repeat": True})
    base_dir = os.path.dirname(os.path.abspath(options_recipe)) if options_recipe else None
    recipes: dict[str, DataRecipe | None] = {}
    for role in SPLITS:
        if not entries[role]:
            if role == "train":
                raise BlendError(_no_training_data(data_path, split, per_split))
            recipes[role] = None
            continue
        recipes[role] = DataRecipe.from_dict(options, source=f"{source} ({role} split)",
                                             base_dir=base_dir, datasets=entries[role],
                                             preset=MEGATRON)
    return recipes


def _no_training_data(data_path: Sequence[str] | None, split: str | None,
                      per_split: Mapping[str, Sequence[str] | None] | None) -> str:
    if per_split is not None:
        return (f"--per-split-data-args-path: the 'train' blend {list(per_split['train'] or [])} "
                "holds no dataset with one --seq-length sample")
    return (f"--split {split or DEFAULT_SPLIT!r} leaves no training documents (of at least one "
            f"--seq-length sample) in {list(data_path or [])}")
