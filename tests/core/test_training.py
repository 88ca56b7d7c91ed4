"""SampleBatch.to_training: the guide's golden case and invariants over random batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import SampleBatch
from zephon.errors import ConfigError
from zephon.ops.pack import Doc, Packer, PackSpec
from zephon.records import Record

BOS, EOS, PAD = 1, 2, 0
A1, A2, B1, B2 = 10, 11, 20, 21


def packed(tokens, positions, padding=0, train_mask=None) -> Record:
    payload = {"input_ids": np.array(tokens, dtype=np.int32),
               "positions": np.array(positions, dtype=np.int32)}
    if train_mask is not None:
        payload["train_mask"] = np.array(train_mask, dtype=bool)
    return Record(payload, {"id": "row", "padding": padding, "documents": ()})


def golden_batch() -> SampleBatch:
    return SampleBatch([packed([BOS, A1, A2, EOS, BOS, B1, B2, EOS], [0, 1, 2, 3, 0, 1, 2, 3])])


def as_list(t):
    return t.tolist()


def test_golden_diagram():
    out = golden_batch().to_training(return_labels=True, return_loss_mask=True,
                                      return_num_valid_tokens=True, return_cu_seqlens=True,
                                      flatten=True)
    assert as_list(out["input_ids"]) == [BOS, A1, A2, EOS, BOS, B1, B2]
    assert as_list(out["labels"]) == [A1, A2, EOS, BOS, B1, B2, EOS]
    assert as_list(out["loss_mask"]) == [1.0] * 7
    assert out["loss_mask"].dtype == torch.float32
    assert int(out["num_valid_tokens"]) == 7
    assert out["num_valid_tokens"].shape == () and out["max_seqlen"].shape == ()
    assert as_list(out["positions"]) == [0, 1, 2, 3, 0, 1, 2]
    assert as_list(out["cu_seqlens"]) == [0, 4, 7]
    assert out["cu_seqlens"].dtype == torch.int32
    assert int(out["max_seqlen"]) == 4


def test_golden_eos_mask_loss():
    out = golden_batch().to_training(return_labels=True, eos_mask_loss=True, eos_token_id=EOS,
                                      return_loss_mask=True, flatten=True)
    assert as_list(out["labels"]) == [A1, A2, EOS, -100, B1, B2, EOS]
    assert as_list(out["loss_mask"]) == [1, 1, 1, 0, 1, 1, 1]


def test_eos_mask_loss_when_bos_is_eos():
    """GPT-2-style tokenizers use one id for BOS and EOS: only EOS -> next document is masked;
    BOS -> first token and an EOS id inside a document still train."""
    E = EOS
    batch = SampleBatch([packed([E, A1, E, A2, E, E, B1, E], [0, 1, 2, 3, 4, 0, 1, 2])])
    out = batch.to_training(return_labels=True, eos_mask_loss=True, eos_token_id=E,
                            flatten=True)
    assert as_list(out["labels"]) == [A1, E, A2, E, -100, B1, E]


def test_golden_sequence_positions():
    out = golden_batch().to_training(return_labels=True, position_mode="sequence", flatten=True,
                                      return_cu_seqlens=True)
    assert as_list(out["positions"]) == list(range(7))
    # Document boundaries still come from the packing, not from the positions returned.
    assert as_list(out["cu_seqlens"]) == [0, 4, 7]


def test_golden_without_labels():
    out = golden_batch().to_training(flatten=True)
    assert as_list(out["input_ids"]) == [BOS, A1, A2, EOS, BOS, B1, B2, EOS]
    assert as_list(out["positions"]) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert set(out) == {"input_ids", "positions"}


def test_row_with_padding():
    batch = SampleBatch([
        packed([BOS, A1, EOS, PAD, PAD], [0, 1, 2, 0, 1], padding=2),
        packed([BOS, B1, B2, B1, EOS], [0, 1, 2, 3, 4]),
    ])
    out = batch.to_training(return_labels=True, return_loss_mask=True,
                            return_num_valid_tokens=True, return_padding_mask=True,
                            return_cu_seqlens=True, ignore_index=-1)
    assert as_list(out["labels"]) == [[A1, EOS, -1, -1], [B1, B2, B1, EOS]]
    assert as_list(out["padding_mask"]) == [[False, False, False, True], [False] * 4]
    assert int(out["num_valid_tokens"]) == 6
    assert as_list(out["cu_seqlens"]) == [[0, 3, 4], [0, 4, -1]]
    assert int(out["max_seqlen"]) == 4


def test_rows_without_padding_give_the_same_fields_and_types():
    """Batches of full rows skip the padding arithmetic; their fields keep shapes and types."""
    full = golden_batch().to_training(return_labels=True, return_loss_mask=True,
                                      return_num_valid_tokens=True, return_padding_mask=True)
    padded = SampleBatch([packed([BOS, A1, A2, EOS, BOS, B1, B2, EOS, PAD],
                                 [0, 1, 2, 3, 0, 1, 2, 3, 0], padding=1)]).to_training(
        return_labels=True, return_loss_mask=True, return_num_valid_tokens=True,
        return_padding_mask=True)
    assert {n: (t.dtype, t.shape) for n, t in full.items()} == {
        "input_ids": (torch.int64, (1, 7)), "positions": (torch.int64, (1, 7)),
        "labels": (torch.int64, (1, 7)), "loss_mask": (torch.float32, (1, 7)),
        "num_valid_tokens": (torch.int64, ()), "padding_mask": (torch.bool, (1, 7))}
    assert {n: t.dtype for n, t in padded.items()} == {n: t.dtype for n, t in full.items()}
    assert as_list(full["padding_mask"]) == [[False] * 7]
    assert as_list(full["loss_mask"]) == [[1.0] * 7] and int(full["num_valid_tokens"]) == 7
    for name in ("input_ids", "positions", "labels", "loss_mask", "padding_mask"):
        assert torch.equal(padded[name][:, :7], full[name])
    assert int(padded["num_valid_tokens"]) == 7


def test_chat_train_mask_masks_labels():
    batch = SampleBatch([packed([BOS, A1, A2, EOS], [0, 1, 2, 3],
                                train_mask=[0, 0, 1, 1])])
    out = batch.to_training(return_labels=True, flatten=True)
    assert as_list(out["labels"]) == [-100, A2, EOS]


def test_rename_and_exclude():
    out = golden_batch().to_training(return_labels=True, return_loss_mask=True,
                                      rename_fields={"input_ids": "tokens"},
                                      exclude_fields=["positions"])
    assert set(out) == {"tokens", "labels", "loss_mask"}
    assert out["tokens"].shape == (1, 7)


@pytest.mark.parametrize("kwargs, option", [
    ({"return_loss_mask": True}, "return_loss_mask"),
    ({"return_num_valid_tokens": True}, "return_num_valid_tokens"),
    ({"return_labels": True, "eos_mask_loss": True}, "eos_token_id"),
    ({"eos_token_id": 2}, "eos_token_id"),
    ({"position_mode": "continuous"}, "position_mode"),
    ({"exclude_fields": ["labels"]}, "exclude_fields"),
    ({"rename_fields": {"cu_seqlens": "cu"}}, "rename_fields"),
    ({"return_labels": True, "rename_fields": {"input_ids": "labels"}}, "rename_fields"),
])
def test_contradictory_options_name_the_option(kwargs, option):
    with pytest.raises(ConfigError, match=option):
        golden_batch().to_training(**kwargs)


def test_each_call_gets_its_own_options_while_checked_options_are_reused():
    """The checked options are kept per set of arguments: calls that differ in one option
    (the ignore index, the position mode, a renamed field, 1 and True) each get their own, a
    refused set is refused on every call, and mutable arguments work (a dict, a list)."""
    batch = golden_batch()
    kwargs = {"return_labels": True, "eos_mask_loss": True, "eos_token_id": EOS}
    assert as_list(batch.to_training(**kwargs, flatten=True)["labels"])[3] == -100
    assert as_list(batch.to_training(**kwargs, ignore_index=-1, flatten=True)["labels"])[3] == -1
    assert as_list(batch.to_training(position_mode="sequence")["positions"]) == [list(range(8))]
    assert set(batch.to_training(rename_fields={"input_ids": "tokens"})) == {"tokens",
                                                                             "positions"}
    assert set(batch.to_training(exclude_fields=["positions"])) == {"input_ids"}
    assert batch.to_training(return_labels=1)["labels"].shape == (1, 7)
    for _ in range(2):
        with pytest.raises(ConfigError, match="eos_token_id"):
            batch.to_training(return_labels=True, eos_mask_loss=True)


def test_refuses_pack_sequences_rows():
    record = Record({"documents": [np.array([1, 2])]},
                    {"id": "r", "packed_sequences": True, "documents": ()})
    with pytest.raises(ConfigError, match="pack_sequences"):
        SampleBatch([record]).to_training()


def test_refuses_non_token_records():
    with pytest.raises(ConfigError, match="input_ids"):
        SampleBatch([Record({"image": np.zeros(3)}, {"id": "x"})]).to_training()


# -- properties over random packed batches ----------------------------------------------------
@st.composite
def random_batches(draw):
    max_length = draw(st.integers(2, 40))
    algorithm = draw(st.sampled_from(["wrap", "first_fit", "best_fit"]))
    lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=25))
    with_masks = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    packer = Packer(PackSpec(max_length, algorithm, max_open_bins=draw(st.integers(1, 4))),
                    PAD, lane=0)
    rows = []
    for i, n in enumerate(lengths):
        tokens = rng.integers(3, 50, size=n).astype(np.int32)
        tokens[-1] = EOS
        mask = rng.random(n) < 0.7 if with_masks else None
        rows += packer.add(Doc(tokens, f"d{i}", "x", 0, mask))
    rows += packer.flush()
    size = draw(st.integers(1, len(rows)))
    return SampleBatch(rows[:size]), max_length


@settings(max_examples=150, deadline=None)
@given(random_batches(), st.booleans())
def test_invariants(case, eos_mask):
    batch, max_length = case
    kwargs = dict(return_labels=True, return_loss_mask=True, return_num_valid_tokens=True,
                  return_cu_seqlens=True, return_padding_mask=True)
    if eos_mask:
        kwargs.update(eos_mask_loss=True, eos_token_id=EOS)
    if max_length < 2:
        return
    out = batch.to_training(**kwargs)
    flat = batch.to_training(**kwargs, flatten=True)
    tokens = np.stack([r.payload["input_ids"] for r in batch.records])
    labels = out["labels"].numpy()
    valid = labels != -100
    # Labels are the inputs shifted by one wherever they count.
    assert (labels[valid] == tokens[:, 1:][valid]).all()
    assert (out["input_ids"].numpy() == tokens[:, :-1]).all()
    assert (out["loss_mask"].numpy() == valid).all()
    assert int(out["num_valid_tokens"]) == int(valid.sum())
    # Padding never counts, as input or as target.
    pad_in = out["padding_mask"].numpy()
    assert not valid[pad_in].any()
    padding = np.array([r.meta["padding"] for r in batch.records])
    assert (pad_in.sum(axis=1) == np.maximum(padding - 1, 0)).all()
    if eos_mask:
        target_starts = np.stack([r.payload["positions"] for r in batch.records])[:, 1:] == 0
        crossing = (out["input_ids"].numpy() == EOS) & target_starts
        assert not valid[crossing].any()
        inside = (out["input_ids"].numpy() == EOS) & ~target_starts & ~pad_in
        assert valid[inside & (labels != -100)].all()
    # cu_seqlens agree with position resets; flatten is a pure reshape.
    positions = out["positions"].numpy()
    starts = np.flatnonzero((positions == 0).ravel())
    width = positions.shape[1]
    expected_cu = np.concatenate([starts, [positions.size]])
    assert (flat["cu_seqlens"].numpy() == expected_cu).all()
    assert int(flat["max_seqlen"]) == int(np.diff(expected_cu).max())
    for name in ("input_ids", "labels", "positions", "loss_mask", "padding_mask"):
        assert torch.equal(flat[name], out[name].reshape(-1))
    # Per-row cu_seqlens hold the same boundaries.
    for row, cu in enumerate(out["cu_seqlens"].numpy()):
        cu = cu[cu >= 0]
        assert cu[0] == 0 and cu[-1] == width
        assert (cu[:-1] == np.flatnonzero(positions[row] == 0)).all()
