"""Loader metrics in Megatron's own TensorBoard and W&B writers, and its log.

Every ``--log-interval`` iterations the training iterator of each reader computes the
``zephon/`` metrics of :mod:`zephon.meter` (wait per microbatch, tokens/s, padding and
loss-bearing shares, realized vs target share per dataset, documents dropped and filtered)
and writes them, at that iteration, to the writers Megatron-LM made
(``get_tensorboard_writer()``, ``get_wandb_writer()``, which exist on the last rank) or to the
writer :func:`set_writer` gave (the CPU smoke run); data-parallel rank 0 also prints them as
one log line. At the end of the data the report is printed.
"""

from __future__ import annotations

from typing import Any

_WRITERS: dict[str, Any] = {}


def set_writer(writer: Any) -> None:
    """Use ``writer`` (``add_scalar(tag, value, step)``) where Megatron-LM has none."""
    _WRITERS["tensorboard"] = writer


def writers() -> tuple[Any, Any]:
    """(TensorBoard writer, W&B run) of this process, either may be None."""
    try:
        from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

        tensorboard, wandb = get_tensorboard_writer(), get_wandb_writer()
    except (ImportError, AssertionError):
        tensorboard = wandb = None
    return tensorboard or _WRITERS.get("tensorboard"), wandb


def write(metrics: dict[str, float], iteration: int) -> bool:
    """Write ``metrics`` at ``iteration`` to this process's writers; True if any took them."""
    tensorboard, wandb = writers()
    if tensorboard is not None:
        for tag, value in metrics.items():
            tensorboard.add_scalar(tag, value, iteration)
    if wandb is not None:
        wandb.log(metrics, iteration)
    return tensorboard is not None or wandb is not None
