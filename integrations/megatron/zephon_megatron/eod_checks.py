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

:func:`eod_problems` then checks the id against the data with the kit's
:mod:`zephon.integration.eos_checks` (the ids the data holds; the ids an indexed dataset's
documents end with), in Megatron's words.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from zephon_megatron.adapter_error import ZephonArgumentError
from zephon_megatron.vocabulary import tokenizer_type


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


RANGE_FIX = "Set [to_training] eos_token_id to the EOD id the data holds, or drop --eod-mask-loss"
EOD_FIX = ("The data was written with another tokenizer's EOD: name that tokenizer "
           "(--tokenizer-type/--tokenizer-model), set [to_training] eos_token_id to the id the "
           "documents end with, or drop --eod-mask-loss")


def document_end_problems(recipe: Any, eod: int, source: str) -> list[str]:
    """Indexed datasets of ``recipe`` whose sampled documents never end with ``eod``."""
    from zephon.integration import document_end_problems as ends_problems

    return ends_problems(recipe, eod, source, flag="--eod-mask-loss", fix=EOD_FIX, name="EOD")


def eod_problems(args: argparse.Namespace, recipe: Any) -> list[str]:
    """The preflight's ``--eod-mask-loss`` checks of a token-id recipe (see the module
    docstring)."""
    if not getattr(args, "eod_mask_loss", False) or recipe.tokenizer is not None:
        return []
    from zephon.integration import eos_mask_problems

    try:
        found = command_line_eod(args, recipe)
    except ZephonArgumentError as exc:
        return [str(exc)]
    return eos_mask_problems(recipe, *found, flag="--eod-mask-loss", fix=EOD_FIX, name="EOD",
                             range_fix=RANGE_FIX) if found else []


def check_eod_occurs(eod: int, recipe: Any) -> None:
    """Refuse an EOD id outside the ids the data holds (the kit's
    :func:`~zephon.integration.eos_range_problem`)."""
    from zephon.integration import eos_range_problem

    problem = eos_range_problem(recipe, eod, flag="--eod-mask-loss", name="EOD", fix=RANGE_FIX)
    if problem:
        raise ZephonArgumentError(problem)
