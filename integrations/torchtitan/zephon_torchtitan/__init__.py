"""TorchTitan adapter for Zephon.

- :class:`ZephonDataLoader` (``zephon_torchtitan.dataloader``): a TorchTitan
  ``BaseDataLoader`` over a Zephon data recipe, with per-lane DCP state.
- :class:`ZephonTrainer` (``zephon_torchtitan.zephon_trainer``): TorchTitan's ``Trainer``
  that checks the recipes against the run and installs the loaders before it builds anything.
- Three ways to select it: a TOML launch recipe (``python -m zephon_torchtitan.train --toml``),
  the config registry (``--module zephon_torchtitan --config zephon_llama3_debugmodel``), and
  an override on any stock config (``--override.imports
  'zephon_torchtitan.override.zephon_dataloader={"recipe": ...}'``).
- Tools (CPU shims for smoke runs, the demo) live apart, in :mod:`zephon_torchtitan_tools`;
  GPU runs never import them.

Exports are resolved lazily, so that importing this package does not import TorchTitan:
the CPU shims must be installed before TorchTitan picks its device type.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "ZephonDataLoader": "zephon_torchtitan.dataloader",
    "ZephonTrainer": "zephon_torchtitan.zephon_trainer",
    "with_zephon": "zephon_torchtitan.config_registry",
    "fit_vocab_size": "zephon_torchtitan.vocab",
    "zephon_llama3_debugmodel": "zephon_torchtitan.config_registry",
    "zephon_llama3_debugmodel_continuous": "zephon_torchtitan.config_registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zephon_torchtitan' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
