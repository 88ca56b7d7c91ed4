"""The model's vocabulary, from Megatron's flags, and the recipe a run reads with it.

Token-id data (``--data-path``, or a ``pretokenized`` recipe without ``[tokenize]
vocab_size``) is checked against the vocabulary of the model Megatron builds: every id must
have an embedding row. That bound is an option of the ``pretokenized`` operator, so it is part
of the pipeline's fingerprint, which a resume must find unchanged. :func:`run_recipe` is the
one place that puts it there: the preflight (before Megatron-LM is imported), the provider
(inside ``pretrain()``) and ``python -m zephon_megatron_tools.trace`` all read the recipe
through it, so they build the same fingerprint.

The vocabulary (:func:`model_vocabulary`) is Megatron's ``padded_vocab_size`` where Megatron
has set it; before that it is computed the way Megatron computes it: the tokenizer's size
rounded up to a multiple of ``--make-vocab-size-divisible-by`` x tensor-parallel size. The
tokenizer's size is known from the command line for

- ``NullTokenizer`` (named, or the entry's default when token-id data comes with
  ``--vocab-size``): ``--vocab-size``, plus the EOD id Megatron-LM's legacy tokenizer adds
  after it in megatron-core <= 0.18 (0.19's keeps ``--vocab-size`` and takes its last id);
- ``HuggingFaceTokenizer`` with a local ``--tokenizer-model`` directory: its length, as
  Megatron's wrapper counts it (``len(tokenizer)``, added tokens included).

Other tokenizers (vocab and merge files, SentencePiece, tiktoken) are sized only by Megatron:
there :func:`model_vocabulary` gives None before ``pretrain()`` and the checks that need it run
in the provider, before the first step. A recipe that sets ``[tokenize] vocab_size`` keeps it
(it must not exceed the model's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from zephon_megatron.adapter_error import ZephonArgumentError

LEGACY_NULL_EOD_BEFORE = (0, 19)
"""megatron-core versions below this build Megatron-LM's legacy NullTokenizer, whose EOD is
``--vocab-size`` itself (one id more); from it, the EOD is the last of ``--vocab-size`` ids."""


def tokenizer_type(args: argparse.Namespace, token_ids: bool) -> str | None:
    """The tokenizer type Megatron will build: ``--tokenizer-type``, else the entry's default
    (:func:`~zephon_megatron.pretrain_gpt.zephon_args_defaults`) for token-id data: a
    NullTokenizer when a vocabulary size is given."""
    named = getattr(args, "tokenizer_type", None)
    if named:
        return str(named)
    if token_ids and getattr(args, "vocab_size", None):
        return "NullTokenizer"
    return None


def null_tokenizer_adds_eod(version: str | None = None) -> bool:
    """Whether Megatron's NullTokenizer has ``--vocab-size + 1`` ids (megatron-core < 0.19)."""
    if version is None:
        from zephon_megatron.compat import megatron_core_version

        version = megatron_core_version()
    if not version:
        return False
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) < LEGACY_NULL_EOD_BEFORE


def tokenizer_size(args: argparse.Namespace, token_ids: bool = True) -> int | None:
    """The size of Megatron's tokenizer before padding, where the command line says it (see
    the module docstring), else None."""
    kind = tokenizer_type(args, token_ids)
    if kind == "NullTokenizer":
        size = getattr(args, "vocab_size", None)
        if not size:
            return None
        return int(size) + (1 if null_tokenizer_adds_eod() else 0)
    model = getattr(args, "tokenizer_model", None)
    if kind == "HuggingFaceTokenizer" and model and os.path.isdir(os.path.expanduser(model)):
        from zephon.errors import ConfigError
        from zephon.text.tokenizer import load_tokenizer

        try:
            return len(load_tokenizer(model))
        except ConfigError:
            return None  # the preflight's tokenizer check names it
    return None


def model_vocabulary(args: argparse.Namespace, token_ids: bool = True) -> int | None:
    """The rows of the model's embedding: Megatron's ``padded_vocab_size`` once set, else
    computed as Megatron pads the tokenizer's size (None where that size is not known yet)."""
    padded = getattr(args, "padded_vocab_size", None)
    if padded:
        return int(padded)
    size = tokenizer_size(args, token_ids)
    if size is None or getattr(args, "pad_vocab_size", True) is False:
        return size  # --no-pad-vocab-size (megatron-core 0.19): the tokenizer's size
    multiple = max(1, int(getattr(args, "make_vocab_size_divisible_by", 128) or 1)) \
        * max(1, int(getattr(args, "tensor_model_parallel_size", 1) or 1))
    return -(-size // multiple) * multiple


def needs_model_vocabulary(recipe: Any) -> bool:
    """Token-id data without its own bound takes the model's vocabulary as its bound."""
    return recipe.tokenizer is None and recipe.tokenize.get("vocab_size") is None


def run_recipe(recipe: Any, args: argparse.Namespace) -> Any:
    """``recipe`` as this run reads it: token-id recipes without ``[tokenize] vocab_size`` get
    the model's vocabulary as their bound (part of the fingerprint; left open where it is not
    known yet, see the module docstring). Refuses a recipe whose ids or tokenizer exceed the
    model's vocabulary."""
    padded = model_vocabulary(args, recipe.tokenizer is None)
    if padded is None:
        return recipe
    if recipe.tokenizer is None:  # token ids already: every id must fit the model
        limit = recipe.tokenize.get("vocab_size")
        if limit is not None and limit > padded:
            raise ZephonArgumentError(
                f"{recipe.source}: [tokenize] vocab_size = {limit} is larger than the model's "
                f"vocabulary ({padded}); size the model for it with --vocab-size {limit} (or "
                "lower the recipe's vocab_size to the ids the data holds)")
        if limit is not None:
            return recipe
        return dataclasses.replace(recipe, tokenize={**recipe.tokenize, "vocab_size": padded})
    if getattr(args, "padded_vocab_size", None):
        from zephon.text.tokenizer import load_tokenizer

        size = len(load_tokenizer(recipe.tokenizer))
        if size > padded:
            raise ZephonArgumentError(
                f"{recipe.source}: its tokenizer has {size} tokens but the model's vocabulary "
                f"has {padded}; set --vocab-size/--tokenizer-model to match the recipe's "
                "tokenizer")
    return recipe
