"""Where megatron-core and Megatron-LM versions differ, in one place (tested: 0.16.1, 0.19.x).

- :func:`stage_reads`: whether a pipeline stage (a model chunk under virtual pipelining) reads
  microbatches. ``is_pipeline_first_stage``/``is_pipeline_last_stage(ignore_virtual,
  vp_stage)`` keep one signature from 0.16 to 0.19.
- :func:`model_vp_stage`: the chunk index Megatron-LM records on each model chunk.
- :func:`install_checkpoint_hook`: Megatron-LM's ``maybe_save_dataloader_state`` reads
  ``train_iterator.iterable`` and so raises ``AttributeError`` on the list of per-chunk
  iterators that virtual pipelining hands it (0.16 and 0.19 alike; 0.19 adds keyword-only
  process groups). The hook is wrapped to pass on the chunk iterator that holds the state.
- megatron-core 0.19's gradient buffers wait on ``torch.cuda.current_stream()``; the CPU runs
  cover that in :mod:`zephon_megatron.cpu_shims`.
- Megatron-LM 0.19 spells document masking ``--dataloader-inter-document-masking`` as well as
  ``--reset-attention-mask``; :mod:`zephon_megatron.arguments` reads either.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def stage_reads(vp_stage: int | None, document_masking: bool) -> bool:
    """True where this stage needs microbatches: the first (tokens, positions) and the last
    (labels, loss mask) pipeline stage, and under document masking every stage, because each
    stage's attention needs the document boundaries (Megatron-LM 0.19's get_batch does the
    same). Middle stages otherwise build no pipeline."""
    if document_masking:
        return True
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() == 1 and vp_stage is None:
        return True
    ignore_virtual = vp_stage is None
    return bool(parallel_state.is_pipeline_first_stage(ignore_virtual=ignore_virtual,
                                                       vp_stage=vp_stage)
                or parallel_state.is_pipeline_last_stage(ignore_virtual=ignore_virtual,
                                                         vp_stage=vp_stage))


def model_vp_stage(model: Any) -> int | None:
    """The virtual pipeline chunk of ``model`` (None without virtual pipelining)."""
    from megatron.core.utils import get_attr_wrapped_model

    try:
        return get_attr_wrapped_model(model, "vp_stage")
    except (AttributeError, RuntimeError):
        return None


def iterator_with_state(train_iterator: Any) -> Any:
    """The iterator whose ``iterable`` saves state: ``train_iterator`` itself, or, for the
    per-chunk list of virtual pipelining, its first chunk that reads (None if none does)."""
    if not isinstance(train_iterator, (list, tuple)):
        return train_iterator
    for chunk in train_iterator:
        if chunk is not None and hasattr(getattr(chunk, "iterable", None), "save_state"):
            return chunk
    return None


def install_checkpoint_hook() -> None:
    """Wrap Megatron-LM's ``maybe_save_dataloader_state`` for per-chunk iterator lists
    (idempotent)."""
    from megatron.training import checkpointing

    original: Callable[..., Any] = checkpointing.maybe_save_dataloader_state
    if getattr(original, "_zephon_wrapped", False):
        return

    @functools.wraps(original)
    def maybe_save_dataloader_state(train_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        return original(iterator_with_state(train_iterator), *args, **kwargs)

    maybe_save_dataloader_state._zephon_wrapped = True  # type: ignore[attr-defined]
    checkpointing.maybe_save_dataloader_state = maybe_save_dataloader_state
