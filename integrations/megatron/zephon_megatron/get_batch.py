"""get_batch: one microbatch from the iterator to the tensors GPTModel.forward takes.

1. Tensor-parallel rank 0 reads the iterator; the other ranks of its tensor-parallel group
   receive the batch by broadcast. A header ``[B, S, K, max_seqlen]`` goes first, because the
   width ``K`` of ``cu_seqlens`` (documents per row + 1) changes from batch to batch; then
   tokens, labels and position_ids in one int64 tensor, the float loss mask, and cu_seqlens.
   Four collectives per microbatch (three without document masking).
2. The attention path decides how document boundaries reach the model:

   - ``"thd"`` (Transformer Engine): the microbatch becomes one packed sequence ``[1, B*S]``
     and :func:`thd_cu_seqlens` turns the per-row ``[B, K]`` boundaries (-1 padded) into one
     1-D int32 vector over the whole microbatch (row ``i`` offset by ``i*S``), handed over as
     ``PackedSeqParams(qkv_format="thd", ...)`` with ``max_seqlen``. No dense mask (TE ignores
     one).
   - ``"dense"`` (megatron-core's local attention, which refuses PackedSeqParams):
     :func:`document_causal_mask` builds a ``[B, 1, S, S]`` bool mask (True = masked) from the
     same boundaries: query ``q`` sees key ``k`` iff ``k <= q`` and both lie in one document.
     It costs ``B*S*S`` bytes, so it suits short contexts and tests, not 8k-token training.

   Without document masking the THD path passes neither (TE's causal mask) and the dense path
   a plain causal mask.
   Positions: ``position_ids`` reach the model as the recipe made them. megatron-core's
   learned absolute embeddings read them; its RoPE does not (it numbers the row 0..S-1, or
   restarts per THD segment), which under document masking changes nothing because RoPE
   scores depend only on the distance between two tokens of the same document.
3. Labels at ignored positions are replaced by token 0 before they reach the model: the loss
   mask already excludes them, and Megatron's fused cross-entropy kernels index the logits by
   label, which a negative ignore value would break.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

ATTENTION_PATHS = ("thd", "dense")


@dataclass
class TensorParallel:
    """This rank's tensor-parallel group, as get_batch needs it."""

    rank: int = 0
    size: int = 1
    src: int = 0
    """Global rank of the group's rank 0 (the reader)."""
    group: Any = None


def tensor_parallel_from_parallel_state() -> TensorParallel:
    from megatron.core import parallel_state

    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return TensorParallel()
    return TensorParallel(parallel_state.get_tensor_model_parallel_rank(), size,
                          parallel_state.get_tensor_model_parallel_src_rank(),
                          parallel_state.get_tensor_model_parallel_group())


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class MegatronBatch:
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    packed_seq_params: Any | None
    cu_seqlens: torch.Tensor | None
    """The boundaries get_batch used: 1-D over the microbatch (THD) or ``[B, K]`` (dense)."""


# -- boundaries --------------------------------------------------------------------------------
def thd_cu_seqlens(cu_seqlens: torch.Tensor, seq_length: int) -> torch.Tensor:
    """``[B, K]`` per-row boundaries (each row ``0, ..., S`` then -1) -> 1-D int32 over the
    microbatch: every row's document starts offset by ``row * S``, then ``B * S``."""
    rows = cu_seqlens.shape[0]
    offsets = torch.arange(rows, device=cu_seqlens.device, dtype=torch.int64)[:, None]
    starts = (cu_seqlens >= 0) & (cu_seqlens < seq_length)
    flat = (cu_seqlens.to(torch.int64) + offsets * seq_length)[starts]
    end = torch.tensor([rows * seq_length], device=cu_seqlens.device, dtype=torch.int64)
    return torch.cat([flat, end]).to(torch.int32)


def document_ids(cu_seqlens: torch.Tensor, seq_length: int) -> torch.Tensor:
    """``[B, S]`` index of the document each token belongs to, from ``[B, K]`` boundaries."""
    rows = cu_seqlens.shape[0]
    starts = torch.zeros(rows, seq_length + 1, dtype=torch.int64, device=cu_seqlens.device)
    index = torch.where(cu_seqlens >= 0, cu_seqlens.to(torch.int64), seq_length)
    starts.scatter_(1, index, 1)
    return starts[:, :seq_length].cumsum(1) - 1


def causal_mask(seq_length: int, device: torch.device | None = None) -> torch.Tensor:
    """``[1, 1, S, S]`` bool, True above the diagonal (masked)."""
    return torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).triu(1)[None,
                                                                                         None]


def document_causal_mask(cu_seqlens: torch.Tensor, seq_length: int) -> torch.Tensor:
    """``[B, 1, S, S]`` bool, True where query ``q`` may not see key ``k``."""
    docs = document_ids(cu_seqlens, seq_length)
    other_doc = docs[:, :, None] != docs[:, None, :]
    return (other_doc | causal_mask(seq_length, cu_seqlens.device)[0])[:, None]


# -- reading and broadcasting ------------------------------------------------------------------
def _read(data_iterator: Iterator[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    try:
        return next(data_iterator)
    except StopIteration:
        source = getattr(getattr(data_iterator, "iterable", data_iterator), "source", "recipe")
        raise RuntimeError(f"zephon_megatron: the training data of {source} ran out; lower "
                           "--train-iters/--train-samples or let datasets repeat "
                           "([mixture] repeat)") from None


def fetch_microbatch(data_iterator: Iterator[dict[str, torch.Tensor]] | None,
                     tp: TensorParallel, device: torch.device) -> dict[str, torch.Tensor]:
    """The reader's microbatch on every rank of the tensor-parallel group."""
    if tp.rank == 0:
        if data_iterator is None:
            raise RuntimeError("get_batch: tensor-parallel rank 0 has no data iterator")
        data = _read(data_iterator)
        cu = data.get("cu_seqlens")
        rows, width = data["tokens"].shape
        header = torch.tensor([rows, width, 0 if cu is None else cu.shape[1],
                               int(data["max_seqlen"].max()) if cu is not None else 0],
                              dtype=torch.int64, device=device)
        ints = torch.stack([data["tokens"], data["labels"], data["position_ids"]]).to(
            device=device, dtype=torch.int64)
        loss_mask = data["loss_mask"].to(device=device, dtype=torch.float32)
        cu = None if cu is None else cu.to(device=device, dtype=torch.int32)
    if tp.size > 1:
        if tp.rank != 0:
            header = torch.empty(4, dtype=torch.int64, device=device)
        torch.distributed.broadcast(header, tp.src, group=tp.group)
        rows, width, k, _ = (int(v) for v in header.tolist())
        if tp.rank != 0:
            ints = torch.empty(3, rows, width, dtype=torch.int64, device=device)
            loss_mask = torch.empty(rows, width, dtype=torch.float32, device=device)
            cu = torch.empty(rows, k, dtype=torch.int32, device=device) if k else None
        torch.distributed.broadcast(ints, tp.src, group=tp.group)
        torch.distributed.broadcast(loss_mask, tp.src, group=tp.group)
        if cu is not None:
            torch.distributed.broadcast(cu, tp.src, group=tp.group)
    out = {"tokens": ints[0], "labels": ints[1], "position_ids": ints[2],
           "loss_mask": loss_mask}
    if cu is not None:
        out["cu_seqlens"] = cu
        out["max_seqlen"] = header[3:4]
    return out


def stage_without_data(attention: str, seq_length: int,
                       device: torch.device | None = None) -> MegatronBatch:
    """The batch of a pipeline stage that reads nothing (a middle stage without document
    masking): no tokens, labels or positions (activations come from the previous stage),
    only the plain causal mask the dense path needs."""
    device = device if device is not None else default_device()
    mask = causal_mask(seq_length, device) if attention == "dense" else None
    return MegatronBatch(None, None, None, mask, None, None, None)  # type: ignore[arg-type]


def get_batch(data_iterator: Iterator[dict[str, torch.Tensor]] | None, *, attention: str,
              tp: TensorParallel | None = None,
              device: torch.device | None = None) -> MegatronBatch:
    """Read (or receive) one microbatch and shape it for ``attention`` ("thd" or "dense")."""
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    tp = tp if tp is not None else tensor_parallel_from_parallel_state()
    device = device if device is not None else default_device()
    data = fetch_microbatch(data_iterator, tp, device)
    tokens, position_ids, loss_mask = data["tokens"], data["position_ids"], data["loss_mask"]
    labels = torch.where(loss_mask > 0, data["labels"], torch.zeros_like(data["labels"]))
    cu = data.get("cu_seqlens")
    width = tokens.shape[1]
    if attention == "dense":
        mask = document_causal_mask(cu, width) if cu is not None else causal_mask(width, device)
        return MegatronBatch(tokens, labels, loss_mask, mask, position_ids, None, cu)
    if cu is None:
        return MegatronBatch(tokens, labels, loss_mask, None, position_ids, None, None)
    from megatron.core.packed_seq_params import PackedSeqParams

    packed = thd_cu_seqlens(cu, width)
    max_seqlen = int(data["max_seqlen"][0])
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=packed, cu_seqlens_kv=packed,
                             max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)
    flat = [t.reshape(1, -1) for t in (tokens, labels, loss_mask, position_ids)]
    return MegatronBatch(flat[0], flat[1], flat[2], None, flat[3], params, packed)
