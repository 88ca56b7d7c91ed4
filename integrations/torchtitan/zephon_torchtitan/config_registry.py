"""Config-registry route: ``--module zephon_torchtitan --config <function>``.

TorchTitan's ``ConfigManager`` imports ``zephon_torchtitan.config_registry`` and calls the
named function, which returns a ``ZephonTrainer.Config`` (:mod:`zephon_torchtitan.zephon_trainer`)
whose dataloader (and validation dataloader) is a :class:`ZephonDataLoader`. The rest of
the command line is parsed by tyro against it, so every Zephon option is a flag:
``--dataloader.recipe``, ``--dataloader.lanes``, ``--dataloader.eos_mask_loss``, ...

The functions here train TorchTitan's llama3 debug model on the recipes in
``recipes/torchtitan/`` of a source checkout (the bundled demo corpus and tokenizer); write
your own with :func:`with_zephon`::

    def my_run() -> ZephonTrainer.Config:
        config = llama3_8b()            # any stock or custom config
        return with_zephon(config, "recipes/my_data.toml", validation="recipes/my_val.toml")

Use the returned config: ``with_zephon`` turns a ``Trainer.Config`` into a
``ZephonTrainer.Config``.

On CPU, run TorchTitan's entry point through the shims (the debug functions then apply the
CPU settings of :func:`zephon_torchtitan_tools.cpu_shims.apply_cpu_config` themselves):
``python -m zephon_torchtitan_tools.cpu_shims -m torchtitan.train --module zephon_torchtitan
--config zephon_llama3_debugmodel`` (one process as written: the shims' entry point sets the
one-process rendezvous variables that torchrun would; under torchrun for several).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from zephon_torchtitan.config_checks import add_preflight
from zephon_torchtitan.dataloader import ZephonDataLoader
from zephon_torchtitan.vocab import follow_recipe_tokenizer
from zephon_torchtitan.zephon_trainer import as_zephon_trainer

RECIPES = Path(os.environ.get("ZEPHON_TORCHTITAN_RECIPES",
                              Path(__file__).resolve().parents[3] / "recipes" / "torchtitan"))


def recipe_path(name: str) -> str:
    """A recipe of ``recipes/torchtitan/`` (or ``$ZEPHON_TORCHTITAN_RECIPES``) by file name."""
    return str(RECIPES / name)


def with_zephon(config: Any, recipe: str, *, validation: str | None = None,
                fit_vocab: bool = True, **options: Any) -> Any:
    """``config`` (a ``Trainer.Config``) made to train on a Zephon data recipe: a
    ``ZephonTrainer.Config`` with the same values, which installs the loaders when TorchTitan
    builds it (a config of another ``Trainer`` subclass keeps its trainer and is changed in
    place, with the preflight override added).

    ``options`` are :class:`ZephonDataLoader.Config` fields. With ``fit_vocab`` the model's
    vocabulary is sized to the recipe's tokenizer, and ``hf_assets_path`` points at that
    tokenizer when it is a local directory (TorchTitan builds its tokenizer from there); both
    follow ``--dataloader.recipe`` when the command line changes it
    (:mod:`zephon_torchtitan.vocab`).
    ``validation`` names a finite, unshuffled recipe for ``validator.dataloader``; the
    validator stays off until ``--validator.enable``. The recipes are checked against the run
    before TorchTitan builds the model (:mod:`zephon_torchtitan.config_checks`).
    """
    config.dataloader = ZephonDataLoader.Config(recipe=recipe, fit_vocab=fit_vocab,
                                                tokenizer_from_recipe=fit_vocab, **options)
    if validation is not None:
        config.validator.dataloader = ZephonDataLoader.Config(recipe=validation)
    follow_recipe_tokenizer(config, config.dataloader)
    trainer = as_zephon_trainer(config)
    return trainer if trainer is not None else add_preflight(config)


def _debug(recipe: str, **training: Any) -> Any:
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = with_zephon(llama3_debugmodel(), recipe_path(recipe),
                         validation=recipe_path("data/validation.toml"))
    config.training.seq_len = 128
    config.training.local_batch_size = 4
    config.training.steps = 20
    config.checkpoint.interval = 10
    config.validator.freq = 10
    config.validator.steps = 2
    for key, value in training.items():
        setattr(config.training, key, value)
    from torchtitan.tools import utils

    if utils.device_type == "cpu":  # only true with the CPU shims installed
        from zephon_torchtitan_tools.cpu_shims import apply_cpu_config

        apply_cpu_config(config)
    return config


def zephon_llama3_debugmodel() -> Any:
    """llama3 debug model, document-masked pretraining on the demo corpus."""
    return _debug("data/pretrain_docmask.toml")


def zephon_llama3_debugmodel_continuous() -> Any:
    """llama3 debug model, continuous positions (rows, not documents, bound attention)."""
    return _debug("data/pretrain_continuous.toml")
