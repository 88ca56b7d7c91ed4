"""get_batch building blocks: THD cu_seqlens, the dense document mask, the two attention paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_megatron.get_batch import (
    TensorParallel,
    document_causal_mask,
    document_ids,
    get_batch,
    thd_cu_seqlens,
)


def padded_cu(rows: list[list[int]]) -> torch.Tensor:
    """[B, K] boundaries, -1 after each row's end, from per-row document lengths."""
    per_row = [[0, *torch.tensor(lengths).cumsum(0).tolist()] for lengths in rows]
    width = max(len(c) for c in per_row)
    return torch.tensor([c + [-1] * (width - len(c)) for c in per_row], dtype=torch.int32)


rows_strategy = st.integers(1, 4).flatmap(lambda b: st.integers(2, 24).flatmap(
    lambda s: st.lists(st.lists(st.integers(1, s), min_size=1, max_size=s).map(
        lambda parts, s=s: _fit(parts, s)), min_size=b, max_size=b).map(lambda r, s=s: (r, s))))


def _fit(parts: list[int], seq: int) -> list[int]:
    out, total = [], 0
    for p in parts:
        p = min(p, seq - total)
        if p <= 0:
            break
        out.append(p)
        total += p
    if total < seq:
        out.append(seq - total)
    return out


def test_thd_cu_seqlens_applies_row_offsets() -> None:
    cu = padded_cu([[4, 3], [3, 2, 2]])
    out = thd_cu_seqlens(cu, 7)
    assert out.dtype == torch.int32 and out.dim() == 1
    assert out.tolist() == [0, 4, 7, 10, 12, 14]


@settings(max_examples=60, deadline=None)
@given(rows_strategy)
def test_thd_cu_seqlens_covers_every_token_once(case: tuple[list[list[int]], int]) -> None:
    rows, seq = case
    cu = thd_cu_seqlens(padded_cu(rows), seq)
    total = len(rows) * seq
    assert cu[0] == 0 and cu[-1] == total
    assert bool((cu[1:] > cu[:-1]).all())
    assert len(cu) - 1 == sum(len(r) for r in rows)
    counts = torch.zeros(total, dtype=torch.int64)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        assert start // seq == (end - 1) // seq, "a segment crosses a row boundary"
        counts[start:end] += 1
    assert bool((counts == 1).all())


@settings(max_examples=40, deadline=None)
@given(rows_strategy)
def test_document_mask_matches_brute_force(case: tuple[list[list[int]], int]) -> None:
    rows, seq = case
    mask = document_causal_mask(padded_cu(rows), seq)
    assert mask.shape == (len(rows), 1, seq, seq) and mask.dtype == torch.bool
    for b, lengths in enumerate(rows):
        doc = [i for i, n in enumerate(lengths) for _ in range(n)]
        expected = torch.tensor([[not (k <= q and doc[k] == doc[q]) for k in range(seq)]
                                 for q in range(seq)])
        assert torch.equal(mask[b, 0], expected)


def test_document_ids_restart_per_row() -> None:
    ids = document_ids(padded_cu([[2, 3], [5]]), 5)
    assert ids.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]]


def _microbatch(with_cu: bool = True) -> dict[str, torch.Tensor]:
    tokens = torch.arange(14, dtype=torch.int64).reshape(2, 7) + 10
    labels = tokens + 1
    labels[0, 3] = -100
    loss_mask = (labels != -100).float()
    data = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
            "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 0, 1, 0, 1]])}
    if with_cu:
        data["cu_seqlens"] = padded_cu([[4, 3], [3, 2, 2]])
        data["max_seqlen"] = torch.tensor([4])
    return data


def test_dense_path_gives_document_mask_and_no_packed_params() -> None:
    batch = get_batch(iter([_microbatch()]), attention="dense", tp=TensorParallel(),
                      device=torch.device("cpu"))
    assert batch.packed_seq_params is None
    assert batch.tokens.shape == (2, 7)
    assert torch.equal(batch.attention_mask, document_causal_mask(padded_cu([[4, 3], [3, 2, 2]]),
                                                                  7))
    assert batch.labels[0, 3] == 0, "ignored labels reach the model as a valid id"
    assert batch.loss_mask[0, 3] == 0


def test_dense_path_without_documents_is_plain_causal() -> None:
    batch = get_batch(iter([_microbatch(with_cu=False)]), attention="dense",
                      tp=TensorParallel(), device=torch.device("cpu"))
    assert batch.attention_mask.shape == (1, 1, 7, 7)
    assert batch.attention_mask[0, 0, 0, 1] and not batch.attention_mask[0, 0, 6, 0]


def test_thd_path_packs_the_microbatch_into_one_sequence() -> None:
    batch = get_batch(iter([_microbatch()]), attention="thd", tp=TensorParallel(),
                      device=torch.device("cpu"))
    params = batch.packed_seq_params
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == [0, 4, 7, 10, 12, 14]
    assert params.cu_seqlens_q.dtype == torch.int32 and params.cu_seqlens_q.dim() == 1
    assert params.cu_seqlens_kv is params.cu_seqlens_q
    assert params.max_seqlen_q == params.max_seqlen_kv == 4
    assert batch.attention_mask is None
    for tensor in (batch.tokens, batch.labels, batch.loss_mask, batch.position_ids):
        assert tensor.shape == (1, 14)
    assert batch.tokens[0, 7] == 17


def test_thd_path_without_documents_leaves_te_causal() -> None:
    batch = get_batch(iter([_microbatch(with_cu=False)]), attention="thd", tp=TensorParallel(),
                      device=torch.device("cpu"))
    assert batch.packed_seq_params is None and batch.attention_mask is None
    assert batch.tokens.shape == (2, 7)


def test_exhausted_iterator_names_the_problem() -> None:
    with pytest.raises(RuntimeError, match="ran out"):
        get_batch(iter([]), attention="dense", tp=TensorParallel(), device=torch.device("cpu"))


def test_unknown_attention_path_is_refused() -> None:
    with pytest.raises(ValueError, match="attention"):
        get_batch(iter([_microbatch()]), attention="flash", tp=TensorParallel())
