"""A data recipe as a ``LightningDataModule``, resumed exactly by Lightning's checkpoints.

The glue, and nothing else: the data comes from :class:`zephon_torch.ZephonIterableDataset`
(microbatches as ``to_training`` dicts, this reader's lanes, start-up checks), and what
Lightning needs is three translations:

- readers: Lightning's ``trainer.global_rank`` and ``trainer.world_size`` are the
  data-parallel rank and size (DDP and FSDP shard data that way);
- what was trained: Lightning's fetcher takes one batch ahead of the step that trains on it
  (to know whether it is the last), so the state of what the loader handed out would skip a
  batch on resume. Each batch therefore carries the loader state as of its own hand-out (in
  the loader's process, a DataLoader worker's included), and when Lightning moves the batch
  to the device for its step (``on_after_batch_transfer``) that state becomes the trained
  one and leaves the batch. The state is a few kilobytes of plain data a batch;
- checkpoints: Lightning writes the checkpoint from global rank 0, so :meth:`state_dict`
  gathers every rank's trained lanes (a collective: Lightning calls it on every rank when it
  saves) into one lane-keyed state, which resumes at any world size dividing the lanes.
  :meth:`load_state_dict` hands it to the dataset before its first batch.

Limits: one ``DataLoader`` worker at most, as for ``zephon_torch``; ``accumulate_grad_batches``
counts microbatches as steps do (each is one batch to Lightning).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from zephon.integration import RunGeometry, job_state, read_state, reader_group
from zephon_torch import ZephonIterableDataset

STATE = "zephon_state"
"""The key that carries a batch's loader state from the loader to the device hook."""


class ZephonDataModule(L.LightningDataModule):
    """A data recipe's microbatches for Lightning's ``fit``; see the module docstring."""

    def __init__(self, recipe: str | os.PathLike[str] | Any, *, seq_len: int | None = None,
                 microbatch_size: int | None = None, lanes: int | None = None,
                 prefetch: int | None = None, workers: int = 0) -> None:
        """``recipe`` and the keywords as for :class:`~zephon_torch.ZephonIterableDataset`
        (a recipe path, a ``DataRecipe`` or a ``Pipeline``); ``workers``: the DataLoader's
        worker processes (0 or 1)."""
        super().__init__()
        self.recipe, self.seq_len, self.microbatch_size = recipe, seq_len, microbatch_size
        self.lanes, self.prefetch, self.workers = lanes, prefetch, workers
        self.dataset: ZephonIterableDataset | None = None
        self._trained: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None

    def setup(self, stage: str) -> None:
        if self.dataset is not None:
            return
        trainer = self.trainer
        geometry = RunGeometry(trainer.global_rank, trainer.world_size) if trainer else None
        self.dataset = ZephonIterableDataset(
            self.recipe, seq_len=self.seq_len, microbatch_size=self.microbatch_size,
            lanes=self.lanes, geometry=geometry, prefetch=self.prefetch, infinite=True)
        if self._pending is not None:
            self.dataset.load_state_dict(self._pending)
            self._trained, self._pending = self._pending, None

    def train_dataloader(self) -> DataLoader:
        if self.dataset is None:
            self.setup("fit")
        return DataLoader(_WithState(self.dataset), batch_size=None,
                          num_workers=self.workers)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and STATE in batch:
            self._trained = batch.pop(STATE)
        return batch

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"loader": envelope}``: every rank's lanes as of the last batch trained, in the
        kit's job-wide envelope (a collective over the ranks, as JSON)."""
        mine = self._trained if self._trained is not None else self._pending
        entries = read_state(mine, "the trained loader state").entries if mine else {}
        world = self.trainer.world_size if self.trainer is not None else 1
        state = job_state(entries, group=reader_group(world))  # every rank takes part
        return {"loader": state} if state is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        loader = state_dict.get("loader")
        if not loader:
            return
        if self.dataset is None:
            self._pending = loader
        else:
            self.dataset.load_state_dict(loader)
            self._trained = loader


class _WithState(IterableDataset):
    """The dataset's items, each with the loader state as of its hand-out."""

    def __init__(self, dataset: ZephonIterableDataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in self.dataset:
            yield {**item, STATE: self.dataset.state_dict()}
