"""SampleBatch: the records of one microbatch and the metadata they carry."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from zephon.records import Record


class SampleBatch:
    """A microbatch of records from one lane.

    ``lane`` and ``index`` say where it came from: it is the ``index``-th microbatch of lane
    ``lane``. It is global microbatch ``index * lanes + lane`` of the run, except in the last
    round of the data (:mod:`zephon.engine.last_round`), where ``position`` holds its global
    microbatch (elsewhere None); :meth:`global_microbatch` gives it either way.
    """

    __slots__ = ("index", "lane", "position", "records")

    def __init__(self, records: Sequence[Record], lane: int = 0, index: int = 0):
        self.records = list(records)
        self.lane = lane
        self.index = index
        self.position: int | None = None

    def global_microbatch(self, lanes: int) -> int:
        """The run's global microbatch index of this microbatch, for a pipeline of ``lanes``."""
        return self.position if self.position is not None else self.index * lanes + self.lane

    @property
    def ids(self) -> list[str]:
        return [r.meta["id"] for r in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return f"SampleBatch(lane={self.lane}, index={self.index}, records={len(self.records)})"

    def to_training(
        self,
        *,
        return_labels: bool = False,
        ignore_index: int = -100,
        eos_mask_loss: bool = False,
        eos_token_id: int | None = None,
        return_loss_mask: bool = False,
        return_num_valid_tokens: bool = False,
        position_mode: str = "preserve",
        return_cu_seqlens: bool = False,
        return_padding_mask: bool = False,
        rename_fields: Mapping[str, str] | None = None,
        exclude_fields: Sequence[str] | None = None,
        flatten: bool = False,
    ) -> dict[str, Any]:
        """Tensors for a training step; see :func:`zephon.training.to_training`."""
        from zephon.training import to_training

        key = (return_labels, ignore_index, eos_mask_loss, eos_token_id, return_loss_mask,
               return_num_valid_tokens, position_mode, return_cu_seqlens, return_padding_mask,
               tuple((rename_fields or {}).items()), tuple(exclude_fields or ()), flatten)
        try:
            options = _options(*key)
        except TypeError:  # an unhashable value: checked (and refused) without the cache
            options = _options.__wrapped__(*key)
        return to_training(self.records, options)


@functools.lru_cache(maxsize=64, typed=True)
def _options(return_labels: bool, ignore_index: int, eos_mask_loss: bool,
             eos_token_id: int | None, return_loss_mask: bool, return_num_valid_tokens: bool,
             position_mode: str, return_cu_seqlens: bool, return_padding_mask: bool,
             rename_fields: tuple[tuple[str, str], ...], exclude_fields: tuple[str, ...],
             flatten: bool) -> Any:
    """The checked options of a ``to_training`` call, made once for each set of arguments (a
    trainer passes the same ones every step, so it would pay for the same check every step;
    measured: docs/measurements.md)."""
    from zephon.training import TrainingOptions

    return TrainingOptions(
        return_labels=return_labels,
        ignore_index=ignore_index,
        eos_mask_loss=eos_mask_loss,
        eos_token_id=eos_token_id,
        return_loss_mask=return_loss_mask,
        return_num_valid_tokens=return_num_valid_tokens,
        position_mode=position_mode,
        return_cu_seqlens=return_cu_seqlens,
        return_padding_mask=return_padding_mask,
        rename_fields=dict(rename_fields),
        exclude_fields=exclude_fields,
        flatten=flatten,
    )
