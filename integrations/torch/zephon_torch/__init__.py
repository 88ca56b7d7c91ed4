"""Zephon in a plain PyTorch training loop: :class:`ZephonIterableDataset`.

Works as it is in a loop, under torchdata's ``StatefulDataLoader`` and under Hugging Face
``accelerate`` (see the package README).
"""

from zephon_torch.dataset import ZephonIterableDataset

__all__ = ["ZephonIterableDataset"]
