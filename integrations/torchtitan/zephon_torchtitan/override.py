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
(:mod:`zephon_torchtitan.config_checks`) as they install the loader; ``zephon_preflight`` runs it
alone, for configs whose loader is Zephon's already (the launcher and the config registry add
it for you).
"""

from __future__ import annotations

from typing import Any

from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config.override import override

from zephon_torchtitan.config_checks import preflight, trainer_config_in_progress
from zephon_torchtitan.dataloader import ZephonDataLoader
from zephon_torchtitan.metrics_processor import as_zephon_metrics


@override(target=BaseDataLoader.Config, fqns=["dataloader"],
          description="Zephon data recipe as the training dataloader")
def zephon_dataloader(config: BaseDataLoader.Config, **options: Any) -> ZephonDataLoader.Config:
    root = trainer_config_in_progress()
    if root is not None and "tokenizer_from_recipe" not in options:
        default = type(root).__dataclass_fields__["hf_assets_path"].default
        options["tokenizer_from_recipe"] = root.hf_assets_path == default
    loader = _zephon_config(options, "zephon_dataloader")
    if root is not None:
        root.metrics = as_zephon_metrics(root.metrics)  # zephon/ metrics in TensorBoard
    return preflight(root, replacing={"dataloader": loader})["dataloader"]


@override(target=BaseDataLoader.Config, fqns=["validator.dataloader"],
          description="Zephon data recipe as the validation dataloader")
def zephon_validation_dataloader(config: BaseDataLoader.Config,
                                 **options: Any) -> ZephonDataLoader.Config:
    loader = _zephon_config(options, "zephon_validation_dataloader")
    return preflight(replacing={"validator.dataloader": loader})["validator.dataloader"]


@override(target=MetricsProcessor.Config, fqns=["metrics"],
          description="TorchTitan's metrics with the Zephon loader's (zephon/ in TensorBoard)")
def zephon_metrics(config: MetricsProcessor.Config) -> MetricsProcessor.Config:
    return as_zephon_metrics(config)


@override(target=ZephonDataLoader.Config, fqns=["dataloader"],
          description="Check the Zephon recipes against the run before the model is built")
def zephon_preflight(config: ZephonDataLoader.Config) -> ZephonDataLoader.Config:
    return preflight(replacing={"dataloader": config})["dataloader"]


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
