"""forward_step and loss_func with per-token normalization.

``loss_func`` returns the *sum* of the per-token losses over the microbatch's trained tokens
and their count, Megatron's three-value contract. With ``--calculate-per-token-loss`` (which
``--dataloader zephon`` requires) Megatron sums both over microbatches and data-parallel ranks
and divides once, so the step's loss is the mean over every trained token of the global batch:
padding and masked labels never enter the numerator or the denominator, and a microbatch with
few trained tokens weighs no more than its tokens. (Without the flag each microbatch's mean
would count equally.) The report ``{"lm loss": [sum, count]}`` is what Megatron's logger
reduces.

``make_forward_step`` binds the attention path once; the returned function has Megatron's
``forward_step(data_iterator, model)`` signature and is what both ``pretrain()`` and the CPU
smoke run call. On a pipeline stage that reads nothing
(:func:`~zephon_megatron.compat.stage_reads`) it runs the model on the previous stage's
activations without touching the iterator.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from zephon_megatron.arguments import settings_from_args
from zephon_megatron.get_batch import TensorParallel, get_batch, stage_without_data

LossResult = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> LossResult:
    """Sum of per-token losses where ``loss_mask`` is set, the token count, and the report."""
    losses = output_tensor.reshape(-1).float()
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    report = {"lm loss": torch.stack([loss.detach(), num_tokens.float()])}
    return loss, num_tokens, report


def make_forward_step(get_args: Callable[[], argparse.Namespace], *,
                      tp: Callable[[], TensorParallel] | None = None,
                      device: torch.device | None = None,
                      stage_reads: Callable[[int | None, bool], bool] | None = None
                      ) -> Callable[..., tuple[torch.Tensor, Callable[..., LossResult]]]:
    """Megatron's ``forward_step_func`` for the zephon batches of the run ``get_args`` names."""
    settings: list[Any] = []

    def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]] | None, model: Any,
                     *_: Any) -> tuple[torch.Tensor, Callable[..., LossResult]]:
        if not settings:
            settings.append(settings_from_args(get_args()))
        run = settings[0]
        if stage_reads is None:
            from zephon_megatron.compat import model_vp_stage
            from zephon_megatron.compat import stage_reads as reads
            vp_stage = model_vp_stage(model)
        else:
            reads, vp_stage = stage_reads, None
        if reads(vp_stage, run.masking.document_masking):
            batch = get_batch(data_iterator, attention=run.attention,
                              tp=tp() if tp is not None else None, device=device)
        else:
            batch = stage_without_data(run.attention, run.seq_length, device)
        output = model(batch.tokens, batch.position_ids, batch.attention_mask,
                       labels=batch.labels, packed_seq_params=batch.packed_seq_params,
                       loss_mask=batch.loss_mask)
        return output, partial(loss_func, batch.loss_mask)

    return forward_step
