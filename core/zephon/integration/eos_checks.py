"""The EOS id a loss mask masks after, checked against token-id data before training.

``eos_mask_loss`` drops the label after every EOS id, so the id must be one the data holds and
the one that ends its documents. Text data gets its EOS from the recipe's tokenizer; token-id
data (Megatron indexed datasets, a ``pretokenized`` recipe) from an id someone typed, or from
the framework's tokenizer, and a wrong one masks nothing, silently. Both checks here run in
every adapter's preflight:

- :func:`eos_range_problem`: an id below 0, or not below the recipe tokenizer's size (text)
  or ``[tokenize] vocab_size`` (token ids), is never in the data;
- :func:`document_end_problems`: for each Megatron indexed dataset of a token-id recipe, the
  last token of up to :data:`SAMPLED_DOCUMENTS` documents spread over it, found from the
  ``.idx`` and read one token each from the memory-mapped ``.bin`` (the index and 4,096 tokens).
  A dataset none of whose sampled documents ends with the id is named, with the ids they do
  end with (Megatron's ``preprocess_data.py --append-eod`` ends every document with its
  tokenizer's EOD). Documents that end otherwise now and then (truncated ones) do not matter;
  a ``pretokenized`` operator that appends its own EOS (``[tokenize] eos_token_id``) ends
  every document with it, and skips the check.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

SAMPLED_DOCUMENTS = 4096
"""Documents per dataset whose last token is read."""


def eos_range_problem(recipe: Any, eos: int, *, flag: str, fix: str,
                      name: str = "EOS") -> str | None:
    """Why ``eos`` can never be in ``recipe``'s data (``flag`` names the masking option,
    ``fix`` ends the message, ``name`` is the framework's name for the id), or None."""
    if recipe.tokenizer is not None:
        from zephon.text.tokenizer import load_tokenizer

        limit, what = len(load_tokenizer(recipe.tokenizer)), f"tokenizer {recipe.tokenizer!r}"
    else:
        limit, what = recipe.tokenize.get("vocab_size"), "[tokenize] vocab_size"
    if eos >= 0 and (limit is None or eos < limit):
        return None
    return (f"{recipe.source}: {flag} masks the label after {name} id {eos}, but the data's ids "
            f"are 0..{'?' if limit is None else limit - 1} ({what}), so none is ever masked. "
            f"{fix}")


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


def document_end_problems(recipe: Any, eos: int, source: str, *, flag: str, fix: str,
                          name: str = "EOS") -> list[str]:
    """The indexed datasets of a token-id ``recipe`` whose sampled documents never end with
    ``eos`` (``source``: where the id came from; ``flag``, ``fix``: as in
    :func:`eos_range_problem`)."""
    if recipe.tokenizer is not None or recipe.tokenize.get("eos_token_id") is not None:
        return []
    problems = []
    for prefix in indexed_prefixes(recipe):
        ends = document_end_ids(prefix)
        if not ends or eos in ends:
            continue
        common = ", ".join(f"{token} ({count} of {sum(ends.values())})"
                           for token, count in ends.most_common(3))
        problems.append(f"{prefix}: {flag} masks the label after {name} id {eos} ({source}), but "
                        f"no sampled document of this dataset ends with it; they end with "
                        f"{common}. {fix}")
    return problems


def eos_mask_problems(recipe: Any, eos: int, source: str, *, flag: str, fix: str,
                      name: str = "EOS", range_fix: str | None = None) -> list[str]:
    """Both checks, as a preflight runs them: an id the data cannot hold
    (:func:`eos_range_problem`, ending with ``range_fix``, else ``fix``), else the indexed
    datasets whose documents never end with it (:func:`document_end_problems`)."""
    problem = eos_range_problem(recipe, eos, flag=flag, fix=range_fix or fix, name=name)
    if problem:
        return [problem]
    return document_end_problems(recipe, eos, source, flag=flag, fix=fix, name=name)
