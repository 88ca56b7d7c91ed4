"""Megatron-LM's tokenizer against the recipe's: EOD ids and the tokenizer actually in use."""

from __future__ import annotations

import argparse
from typing import Any

from zephon.errors import ConfigError
from zephon_megatron.adapter_error import ZephonArgumentError


def megatron_tokenizer() -> Any:
    """Megatron-LM's tokenizer inside ``pretrain()``, else None."""
    try:
        from megatron.training import get_tokenizer

        return get_tokenizer()
    except (ImportError, AssertionError):
        return None


NULL_LIBRARIES = ("null-text", "null-multimodal")
"""megatron-core 0.19's library names of its null tokenizers."""


def _is_null(tokenizer: Any) -> bool:
    """Megatron's NullTokenizer: it has no end-of-document token, only an id derived from
    ``--vocab-size`` (``vocab_size`` before megatron-core 0.19, ``vocab_size - 1`` after).
    megatron-core <= 0.18 builds it as it is; 0.19 wraps it in ``DefaultTokenizerText`` with
    ``library = "null-text"``."""
    inner = getattr(tokenizer, "_tokenizer", None)
    return ("NullTokenizer" in type(tokenizer).__name__
            or getattr(tokenizer, "library", None) in NULL_LIBRARIES
            or (inner is not None and "NullTokenizer" in type(inner).__name__))


def _null_eod_chosen() -> bool:
    """Whether Megatron-LM's ``--null-tokenizer-eod-id`` (megatron-core 0.19) set the null
    tokenizer's EOD on purpose."""
    try:
        from megatron.training import get_args

        return getattr(get_args(), "null_tokenizer_eod_id", None) is not None
    except (ImportError, AssertionError):
        return False


def eod_id(recipe: Any, tokenizer: Any = None) -> int:
    """The EOS id for ``--eod-mask-loss``: the recipe's, else (token-id data) the EOD of
    Megatron-LM's ``tokenizer``. An id no token can carry is an error (see
    :func:`check_eod_occurs`), never a mask that masks nothing."""
    try:
        eod = recipe.eos_token_id()
    except ConfigError:
        if recipe.tokenizer is not None:
            raise
        eod = None
    if eod is None:  # token-id data: Megatron's EOD, which the documents must end with
        from zephon_megatron.eod_checks import document_end_problems

        eod = _megatron_eod(recipe, tokenizer)
        problems = document_end_problems(recipe, eod, f"Megatron's {type(tokenizer).__name__}")
        if problems:
            raise ZephonArgumentError("\n".join(problems))
    from zephon_megatron.eod_checks import check_eod_occurs

    check_eod_occurs(eod, recipe)
    return eod


def _megatron_eod(recipe: Any, tokenizer: Any) -> int:
    """The EOD of Megatron-LM's tokenizer for token-id data; NullTokenizer's is refused."""
    if tokenizer is None or getattr(tokenizer, "eod", None) is None:
        raise ZephonArgumentError(
            f"{recipe.source}: --eod-mask-loss needs the EOD id of the token-id data; set "
            "[to_training] eos_token_id in --zephon-recipe (or run inside Megatron-LM, whose "
            "tokenizer knows it)")
    eod = int(tokenizer.eod)
    if _is_null(tokenizer) and not _null_eod_chosen():
        from zephon_megatron.eod_checks import null_tokenizer_eod

        raise ZephonArgumentError(null_tokenizer_eod(eod))
    return eod


def check_tokenizers(recipe: Any, args: argparse.Namespace, tokenizer: Any) -> None:
    """Megatron-LM's tokenizer must end documents as the recipe's tokenizer does.

    With ``--dataloader zephon`` the recipe's tokenizer makes every training id and its EOS
    marks the document boundaries (``--eod-mask-loss``, document masking); Megatron-LM's
    tokenizer (``--tokenizer-type``/``--tokenizer-model``) is the one it evaluates, generates
    and exports the checkpoint with. A different EOS id means different tokenizers, so the
    model would be read with ids it was not trained on: an error. Megatron's NullTokenizer
    (the entry's default, which carries only the vocabulary size) and token-id data (no recipe
    tokenizer: Megatron's EOD is the data's) are not compared. The recipe tokenizer's own EOS
    counts, not ``[to_training] eos_token_id``, which may choose another boundary token on
    purpose."""
    if recipe.tokenizer is None or tokenizer is None or _is_null(tokenizer):
        return
    from zephon.integration import tokenizer_mismatch

    model = getattr(args, "tokenizer_model", None)
    megatron = f"{type(tokenizer).__name__}" + (f" {model!r}" if model else "")
    theirs = getattr(tokenizer, "eod", None)
    problem = tokenizer_mismatch(
        recipe, vocab=None, eos=theirs, theirs=f"--tokenizer-model: Megatron's tokenizer "
        f"({megatron})", fix="Pass the recipe's tokenizer as --tokenizer-model, point "
        "[tokenize] tokenizer at Megatron's, or leave --tokenizer-type/--tokenizer-model out "
        "(the entry then sizes a NullTokenizer to the recipe's tokenizer)")
    if problem:
        raise ZephonArgumentError(problem)
