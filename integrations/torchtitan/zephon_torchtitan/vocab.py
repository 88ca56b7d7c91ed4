"""The model's vocabulary and TorchTitan's tokenizer path, made to follow the data recipe.

A config is built before its command line is parsed, so a config that sized the model to one
recipe's tokenizer would keep that size when ``--dataloader.recipe`` names another.
:func:`follow_recipe_tokenizer` runs in the preflight, after parsing and before the model is
built, and fits both to the recipe actually in use, as the loader config's ``fit_vocab`` and
``tokenizer_from_recipe`` ask.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def fit_vocab_size(config: Any, vocab_size: int) -> None:
    """Size a decoder model's embedding, output layer and loss to ``vocab_size`` tokens."""
    from torchtitan.components.loss import CrossEntropyLoss

    fit_model_vocab(config.model_spec.model, vocab_size)
    for _, loss, _, _ in config.loss.traverse(CrossEntropyLoss.Config):
        if loss.global_vocab_size is not None:
            loss.global_vocab_size = vocab_size


def fit_model_vocab(model: Any, vocab_size: int) -> None:
    """Size a ``Decoder.Config``'s vocabulary, embedding and output layer (in place)."""
    from torchtitan.models.common.decoder import Decoder

    if not isinstance(model, Decoder.Config):
        raise TypeError(f"fit_model_vocab needs a Decoder model config, got "
                        f"{type(model).__name__}")
    model.vocab_size = vocab_size
    model.tok_embeddings.num_embeddings = vocab_size
    model.lm_head.out_features = vocab_size


def follow_recipe_tokenizer(root: Any, loader: Any, log: Any = None) -> None:
    """Fit ``root`` (a ``Trainer.Config``) to the tokenizer of ``loader``'s recipe: the model's
    vocabulary with ``loader.fit_vocab``, ``hf_assets_path`` with
    ``loader.tokenizer_from_recipe`` (unless ``--hf_assets_path`` is on the command line).
    Each change is logged through ``log`` (a logger)."""
    from zephon_torchtitan.dataloader import read_recipe

    if not (loader.fit_vocab or loader.tokenizer_from_recipe) or not loader.recipe:
        return
    tokenizer = read_recipe(loader.recipe).tokenizer
    if tokenizer is None or not Path(tokenizer).is_dir():
        return
    explicit = any(arg.split("=")[0] in ("--hf_assets_path", "--hf-assets-path")
                   for arg in sys.argv)
    if loader.tokenizer_from_recipe and not explicit and root.hf_assets_path != tokenizer:
        root.hf_assets_path = tokenizer
        if log is not None:
            log.info(f"zephon: hf_assets_path = {tokenizer} (the tokenizer of "
                     f"{loader.recipe})")
    if loader.fit_vocab:
        from zephon.text.tokenizer import load_tokenizer

        size = len(load_tokenizer(tokenizer))
        before = getattr(root.model_spec.model, "vocab_size", None)
        if before != size:
            fit_vocab_size(root, size)
            if log is not None:
                log.info(f"zephon: model vocabulary {before} -> {size} (fit_vocab: the "
                         f"tokenizer of {loader.recipe})")
