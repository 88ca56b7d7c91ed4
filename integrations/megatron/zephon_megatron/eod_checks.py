"""``--eod-mask-loss`` on token-id data, checked before the model is built.

The mask drops the label after every EOD id, so the id must be the one that ends the data's
documents. For token-id data (``--data-path``, a ``pretokenized`` recipe) it comes from
``[to_training] eos_token_id`` (or ``[tokenize] eos_token_id``), else from Megatron's
tokenizer. :func:`command_line_eod` finds it before Megatron-LM is imported where the command
line says it:

- Megatron's NullTokenizer (named, or the entry's default with ``--vocab-size``) invents its
  EOD from ``--vocab-size``: refused, unless ``--null-tokenizer-eod-id`` (megatron-core 0.19)
  names it;
- ``HuggingFaceTokenizer`` with a local ``--tokenizer-model`` directory: its EOS id;
- other tokenizers are built by Megatron only: the provider checks their EOD, before the
  first step.

:func:`document_end_problems` then reads how the documents of each Megatron indexed dataset
end (``preprocess_data.py --append-eod`` ends every one with its tokenizer's EOD): the last
token of up to :data:`SAMPLED_DOCUMENTS` documents spread over the dataset, found from the
``.idx`` (sequence pointers and lengths, the document index) and read one token each from the
memory-mapped ``.bin``. A dataset none of whose sampled documents ends with the EOD is refused,
naming the ids they do end with: the mask would hit no label (Megatron's loader does the same
silently). Documents that end otherwise now and then (truncated ones) do not matter; a
``pretokenized`` operator that appends its own ``eos_token_id`` skips the check (its EOS ends
every document).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import Any

import numpy as np

from zephon_megatron.adapter_error import ZephonArgumentError
from zephon_megatron.vocabulary import tokenizer_type

SAMPLED_DOCUMENTS = 4096
"""Documents per dataset whose last token is read."""

def null_tokenizer_eod(eod: int | None = None) -> str:
    """Why a NullTokenizer's EOD (``eod`` where known) is refused for --eod-mask-loss (here
    and in the provider)."""
    which = "the EOD id" if eod is None else f"the EOD id {eod}"
    return (
        f"--eod-mask-loss: {which} of Megatron's NullTokenizer is made up from --vocab-size "
        "(one past the last id in megatron-core <= 0.18, the last id from 0.19): it is not "
        "the EOD the data was written with, so the mask would hit no label or the wrong ones. "
        "Set [to_training] eos_token_id in --zephon-recipe to the EOD id the data was written "
        "with (preprocess_data.py --append-eod writes its tokenizer's EOD) or pass it as "
        "--null-tokenizer-eod-id (megatron-core 0.19+), or name that tokenizer with "
        "--tokenizer-type/--tokenizer-model, or drop --eod-mask-loss")


def recipe_eod(recipe: Any) -> int | None:
    """The EOD a token-id recipe names itself (``[to_training]``, else ``[tokenize]``)."""
    eos = recipe.to_training.get("eos_token_id")
    if eos is None:
        eos = recipe.tokenize.get("eos_token_id")
    return None if eos is None else int(eos)


def command_line_eod(args: argparse.Namespace, recipe: Any) -> tuple[int, str] | None:
    """(the EOD id ``--eod-mask-loss`` masks after, where it comes from) for token-id data,
    where the command line says it; None where only Megatron knows (see the module
    docstring). Raises for a NullTokenizer without a chosen EOD."""
    eos = recipe_eod(recipe)
    if eos is not None:
        return eos, f"eos_token_id of {recipe.source}"
    kind = tokenizer_type(args, token_ids=True)
    if kind == "NullTokenizer":
        chosen = getattr(args, "null_tokenizer_eod_id", None)
        if chosen is None:
            raise ZephonArgumentError(null_tokenizer_eod())
        return int(chosen), "--null-tokenizer-eod-id"
    model = getattr(args, "tokenizer_model", None)
    if kind == "HuggingFaceTokenizer" and model and os.path.isdir(os.path.expanduser(model)):
        from zephon.errors import ConfigError
        from zephon.text.tokenizer import load_tokenizer

        try:
            eos = getattr(load_tokenizer(model), "eos_token_id", None)
        except ConfigError:
            return None  # the preflight's tokenizer check names it
        return (int(eos), f"--tokenizer-model {model!r}") if eos is not None else None
    return None


def document_end_ids(prefix: str, sample: int = SAMPLED_DOCUMENTS) -> Counter[int]:
    """How often each id ends one of up to ``sample`` documents of an indexed dataset, spread
    evenly over it (empty documents left out)."""
    from zephon.io.indexed import open_indexed

    data = open_indexed(prefix)
    last = data.doc_index[1:] - 1  # each document's last sequence
    last = last[last >= data.doc_index[:-1]]  # documents with at least one sequence
    lengths = data.lengths[last]
    last = last[lengths > 0]
    if len(last) > sample:
        last = last[np.linspace(0, len(last) - 1, sample).astype(np.int64)]
    ends = data.starts[last] + data.lengths[last].astype(np.int64) - 1
    return Counter(int(i) for i in data.tokens[ends])


def indexed_prefixes(recipe: Any) -> list[str]:
    """The prefixes of the Megatron indexed datasets ``recipe`` reads, each once."""
    from zephon.io.indexed import prefix_of

    prefixes: list[str] = []
    for entry in recipe.datasets:
        prefix = prefix_of(str(entry.path)) if entry.fmt in (None, "megatron") else None
        if prefix is not None and prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes


def _appends_eos(recipe: Any) -> bool:
    return recipe.tokenize.get("eos_token_id") is not None


def document_end_problems(recipe: Any, eod: int, source: str) -> list[str]:
    """Indexed datasets of ``recipe`` whose sampled documents never end with ``eod``."""
    if recipe.tokenizer is not None or _appends_eos(recipe):
        return []
    problems = []
    for prefix in indexed_prefixes(recipe):
        ends = document_end_ids(prefix)
        if not ends or eod in ends:
            continue
        common = ", ".join(f"{token} ({count} of {sum(ends.values())})"
                           for token, count in ends.most_common(3))
        problems.append(
            f"{prefix}: --eod-mask-loss masks the label after EOD id {eod} ({source}), but no "
            f"sampled document of this dataset ends with it; they end with {common}. The data "
            "was written with another tokenizer's EOD: name that tokenizer (--tokenizer-type/"
            "--tokenizer-model), set [to_training] eos_token_id to the id the documents end "
            "with, or drop --eod-mask-loss")
    return problems


def eod_problems(args: argparse.Namespace, recipe: Any) -> list[str]:
    """The preflight's ``--eod-mask-loss`` checks of a token-id recipe (see the module
    docstring)."""
    if not getattr(args, "eod_mask_loss", False) or recipe.tokenizer is not None:
        return []
    try:
        found = command_line_eod(args, recipe)
        if found:
            check_eod_occurs(found[0], recipe)  # an id beyond the data's: said as such
    except ZephonArgumentError as exc:
        return [str(exc)]
    return document_end_problems(recipe, *found) if found else []


def check_eod_occurs(eod: int, recipe: Any) -> None:
    """Refuse an EOD id outside the ids the data holds: below 0, or not below the recipe
    tokenizer's size (text) or ``[tokenize] vocab_size`` (token ids)."""
    if recipe.tokenizer is not None:
        from zephon.text.tokenizer import load_tokenizer

        limit, what = len(load_tokenizer(recipe.tokenizer)), f"tokenizer {recipe.tokenizer!r}"
    else:
        limit, what = recipe.tokenize.get("vocab_size"), "[tokenize] vocab_size"
    if eod < 0 or (limit is not None and eod >= limit):
        raise ZephonArgumentError(
            f"{recipe.source}: --eod-mask-loss masks the label after EOD id {eod}, but the "
            f"data's ids are 0..{'?' if limit is None else limit - 1} ({what}), so none is "
            "ever masked. Set [to_training] eos_token_id to the EOD id the data holds, or "
            "drop --eod-mask-loss")
