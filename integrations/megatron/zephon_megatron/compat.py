"""Where megatron-core and Megatron-LM versions differ, in one place (tested: 0.16.1, 0.19.x).

- :func:`stage_reads`: whether a pipeline stage (a model chunk under virtual pipelining) reads
  microbatches. ``is_pipeline_first_stage``/``is_pipeline_last_stage(ignore_virtual,
  vp_stage)`` keep one signature from 0.16 to 0.19.
- :func:`model_vp_stage`: the chunk index Megatron-LM records on each model chunk.
- :func:`install_checkpoint_hook`: Megatron-LM's ``maybe_save_dataloader_state`` reads
  ``train_iterator.iterable`` and so raises ``AttributeError`` on the list of per-chunk
  iterators that virtual pipelining hands it (0.16 and 0.19 alike; 0.19 adds keyword-only
  process groups). The hook is wrapped to pass on the chunk iterator that holds the state.
- :func:`run_pretrain`: Megatron-LM 0.16's ``pretrain()`` parses the command line itself
  (``args_defaults``, ``extra_args_provider``) and builds the model with a ``model_provider``
  from the checkout's ``model_provider.py``/``gpt_builders.py``; 0.19's takes a config
  container built from already parsed arguments (``parse_and_validate_args``,
  ``pretrain_cfg_container_from_args``) and builds the GPT model from it, so megatron-core
  0.19's own ``megatron.training`` suffices.
- megatron-core 0.19's gradient buffers wait on ``torch.cuda.current_stream()``; the CPU runs
  cover that in :mod:`zephon_megatron_tools.cpu_shims`.
- Megatron-LM 0.19 spells document masking ``--dataloader-inter-document-masking`` as well as
  ``--reset-attention-mask``; :mod:`zephon_megatron.arguments` reads either.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def pretrain_takes_a_config() -> bool:
    """True for Megatron-LM 0.19+ (``pretrain(cfg_container, ...)``)."""
    from megatron.training import pretrain

    return "args_defaults" not in inspect.signature(pretrain).parameters


def modules_for_pretrain() -> tuple[str, ...]:
    """What ``pretrain()`` with the zephon provider imports beyond megatron-core."""
    try:
        if pretrain_takes_a_config():
            return ("megatron.training",)
    except ImportError:
        pass
    return ("megatron.training", "gpt_builders", "model_provider")


def run_pretrain(dataset_provider: Any, forward_step: Any, *,
                 extra_args_provider: Callable[[Any], Any], args_defaults: dict[str, Any],
                 get_embedding_ranks: Callable[[list[int]], list[int]] | None = None) -> None:
    """Megatron-LM's ``pretrain()`` for a GPT model, either signature; reads ``sys.argv``."""
    from megatron.core.enums import ModelType
    from megatron.training import pretrain

    if not pretrain_takes_a_config():
        from gpt_builders import gpt_builder
        from model_provider import model_provider

        pretrain(dataset_provider, functools.partial(model_provider, gpt_builder),
                 ModelType.encoder_or_decoder, forward_step, args_defaults=args_defaults,
                 extra_args_provider=extra_args_provider,
                 get_embedding_ranks=get_embedding_ranks)
        return
    from megatron.training.argument_utils import (
        gpt_config_from_args,
        pretrain_cfg_container_from_args,
    )
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=extra_args_provider,
                                   args_defaults=args_defaults)
    config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(config, dataset_provider, ModelType.encoder_or_decoder, forward_step,
             get_embedding_ranks=get_embedding_ranks)


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


def megatron_core_version() -> str | None:
    """The installed megatron-core's version (its distribution metadata), or None."""
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None
