"""Override route: swap the training dataloader of any stock TorchTitan config for Zephon.

::

    python -m torchtitan.train --module llama3 --config llama3_8b \\
        --override.imports 'zephon_torchtitan.override.zephon_dataloader={"recipe": "data.toml"}'

The JSON object holds :class:`ZephonDataLoader.Config` fields (``recipe`` is required) and
``fit_vocab`` (true: size the model's vocabulary to the recipe's tokenizer, as the launcher's
``vocab_size = "tokenizer"`` does). TorchTitan's tokenizer (``hf_assets_path``) defaults to
the recipe's when left at TorchTitan's default.
``zephon_dataloader`` claims only ``dataloader``; ``zephon_validation_dataloader`` claims
``validator.dataloader`` (activate both to validate on a Zephon recipe too). An override
replaces loader configs only: the model's vocabulary must already cover the recipe's
tokenizer (the preflight refuses a larger tokenizer before the model is built) and
``--hf_assets_path`` should name that tokenizer (the loader refuses a mismatch unless
``--dataloader.no-check-tokenizer``).

TorchTitan applies overrides before it builds the model, so both run the preflight
(:func:`zephon_torchtitan.config_checks.install_loaders`) as they install the loader;
``zephon_preflight`` runs it alone, for configs of TorchTitan's ``Trainer`` whose loader is
Zephon's already (``with_zephon`` adds it to configs of a ``Trainer`` subclass other than
``ZephonTrainer``).

TorchTitan 0.3.0 hands an override factory only the node it replaces, and refuses a factory
that claims the root config. The run's values (sequence length, batch, parallelism, model
vocabulary, checkpoint folder) and the metrics config live elsewhere in the tree, so this
module finds the whole config on the call stack, in the ``apply_overrides`` call running the
factory (:func:`trainer_config_in_progress`); the launcher and the config registry do not
need it (:mod:`zephon_torchtitan.zephon_trainer`). Under a TorchTitan without that call the recipe
is checked without the run's values and the metrics are not linked.
"""

from __future__ import annotations

import sys
from typing import Any

from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.config.override import override

from zephon_torchtitan.config_checks import install_loaders, preflight
from zephon_torchtitan.dataloader import ZephonDataLoader


@override(target=BaseDataLoader.Config, fqns=["dataloader"],
          description="Zephon data recipe as the training dataloader")
def zephon_dataloader(config: BaseDataLoader.Config, **options: Any) -> ZephonDataLoader.Config:
    root = trainer_config_in_progress()
    if root is not None and "tokenizer_from_recipe" not in options:
        default = type(root).__dataclass_fields__["hf_assets_path"].default
        options["tokenizer_from_recipe"] = root.hf_assets_path == default
    loader = _zephon_config(options, "zephon_dataloader")
    return _install(root, {"dataloader": loader})["dataloader"]


@override(target=BaseDataLoader.Config, fqns=["validator.dataloader"],
          description="Zephon data recipe as the validation dataloader")
def zephon_validation_dataloader(config: BaseDataLoader.Config,
                                 **options: Any) -> ZephonDataLoader.Config:
    loader = _zephon_config(options, "zephon_validation_dataloader")
    return _install(trainer_config_in_progress(),
                    {"validator.dataloader": loader})["validator.dataloader"]


@override(target=ZephonDataLoader.Config, fqns=["dataloader"],
          description="Check the Zephon recipes against the run before the model is built")
def zephon_preflight(config: ZephonDataLoader.Config) -> ZephonDataLoader.Config:
    return _install(trainer_config_in_progress(), {"dataloader": config})["dataloader"]


def trainer_config_in_progress() -> Any:
    """The ``Trainer.Config`` that TorchTitan's ``apply_overrides`` is applying, if any."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "apply_overrides":
            root = frame.f_locals.get("config_root")
            if root is not None and hasattr(root, "training"):
                return root
        frame = frame.f_back
    return None


def _install(root: Any, replacing: dict[str, Any]) -> dict[str, Any]:
    """Check and install the loaders of ``replacing`` (and only those)."""
    only = tuple(replacing)
    return install_loaders(root, replacing, only=only) if root is not None \
        else preflight(None, replacing, only=only)


def _zephon_config(options: dict[str, Any], name: str) -> ZephonDataLoader.Config:
    from zephon import ConfigError

    if not options.get("recipe"):
        raise ConfigError(f"--override.imports 'zephon_torchtitan.override.{name}="
                          '{"recipe": "<data recipe TOML>", ...}\' needs a recipe')
    known = set(ZephonDataLoader.Config.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"zephon_torchtitan.override.{name}: unknown option(s) {unknown}; "
                          f"known: {sorted(known)}")
    return ZephonDataLoader.Config(**options)
