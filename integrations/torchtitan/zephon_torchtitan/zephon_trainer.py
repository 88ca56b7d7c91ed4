"""``ZephonTrainer``: TorchTitan's ``Trainer`` that installs the Zephon loaders itself.

The launcher (:mod:`zephon_torchtitan.train`) and the config registry
(:func:`zephon_torchtitan.config_registry.with_zephon`) return a ``ZephonTrainer.Config``.
``torchtitan.train`` builds it (``config.build()``) after parsing the command line, and
:meth:`ZephonTrainer.init_distributed` hands the whole parsed config to
:func:`zephon_torchtitan.config_checks.install_loaders` as soon as the process group exists,
before TorchTitan builds the model: the recipes are checked against the run (one rank lists
the data for the job, :func:`zephon.distributed.once_per_job`), the checkpoint folder is
filled in and the metrics processor is linked to the training loader. The values
travel in the config; nothing is looked up on the call stack or kept in a module global.

The override route must work on TorchTitan's own ``Trainer``, whose override API hands a
factory only the node it replaces; :mod:`zephon_torchtitan.override` is therefore the one
place that finds the whole config on the call stack.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torchtitan.trainer import Trainer

from zephon_torchtitan.config_checks import install_loaders


class ZephonTrainer(Trainer):
    """TorchTitan's ``Trainer``; its config's Zephon loaders are checked and installed
    before anything is built."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def init_distributed(self) -> Any:
        parallel_dims = super().init_distributed()
        install_loaders(self.config)
        return parallel_dims


def as_zephon_trainer(config: Any) -> Any:
    """``config`` (a ``Trainer.Config``) as a ``ZephonTrainer.Config`` with the same field
    values, or None for a config of another ``Trainer`` subclass (that trainer is kept, and
    the loaders are installed by an override instead)."""
    if isinstance(config, ZephonTrainer.Config):
        return config
    if type(config) is not Trainer.Config:
        return None
    return ZephonTrainer.Config(**{f.name: getattr(config, f.name) for f in fields(config)
                                   if f.init})
