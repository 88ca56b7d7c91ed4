"""Zephon in PyTorch Lightning: :class:`ZephonDataModule`."""

from zephon_lightning.datamodule import ZephonDataModule

__all__ = ["ZephonDataModule"]
