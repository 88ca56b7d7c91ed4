"""``SampleBatch.to_training``: packed rows -> the tensors a trainer consumes.

For a microbatch of ``B`` rows of ``S`` tokens (pack to context length + 1):

- ``input_ids`` ``[B, S-1]`` and ``labels`` ``[B, S-1]`` (``labels[i] = tokens[i+1]``) with
  ``return_labels``; otherwise ``input_ids`` is the whole row.
- A label is set to ``ignore_index`` when its target is padding (always), when its target is
  outside a chat ``train_mask`` (tokenize_chat data), and with ``eos_mask_loss`` when its input
  is ``eos_token_id`` and its target starts the next document (the EOS -> BOS prediction).
- ``loss_mask`` (float32) is ``labels != ignore_index``; ``num_valid_tokens`` its sum.
- ``positions``: per document (``preserve``, restarting at 0 at each document, padding its own
  run) or ``0..n-1`` over the row (``sequence``).
- ``cu_seqlens`` (int32) are the document starts (position resets) plus the end. Flattened: one
  vector over the whole microbatch, rows offset by their start. Not flattened: ``[B, K]``, each
  row padded with -1 after its end. ``max_seqlen`` is the longest segment.
- ``padding_mask`` (bool): True where the input token is padding.
- ``flatten`` reshapes every ``[B, n]`` tensor to ``[B * n]``.

All of it is vectorized over the microbatch; no per-token Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.records import Record

POSITION_MODES = ("preserve", "sequence")
OUTPUT_FIELDS = ("input_ids", "labels", "positions", "loss_mask", "num_valid_tokens",
                 "cu_seqlens", "max_seqlen", "padding_mask")


@dataclass(frozen=True)
class TrainingOptions:
    """The options of ``to_training``; contradictory or incomplete sets raise ConfigError."""

    return_labels: bool = False
    """Return ``labels`` (inputs shifted by one); rows of length S give S - 1 positions."""
    ignore_index: int = -100
    """Label value of positions that carry no loss (padding, masked tokens)."""
    eos_mask_loss: bool = False
    """Ignore the label that predicts the next document from an EOS token."""
    eos_token_id: int | None = None
    """The EOS id used by ``eos_mask_loss`` (recipes fill it from the tokenizer)."""
    return_loss_mask: bool = False
    """Return ``loss_mask`` (float, 1 where the label counts)."""
    return_num_valid_tokens: bool = False
    """Return ``num_valid_tokens``, the number of labels that count."""
    position_mode: str = "preserve"
    """``preserve`` (positions restart at each document) or ``sequence`` (0..S-1 per row)."""
    return_cu_seqlens: bool = False
    """Return ``cu_seqlens``, cumulative document boundaries (and ``max_seqlen``)."""
    return_padding_mask: bool = False
    """Return ``padding_mask`` (True on padding)."""
    rename_fields: dict[str, str] = field(default_factory=dict)
    """Output names to rename, ``{produced: wanted}``."""
    exclude_fields: tuple[str, ...] = ()
    """Produced fields to leave out."""
    flatten: bool = False
    """Return 1-D tensors over the whole microbatch (``[B * S]``) instead of ``[B, S]``."""

    def __post_init__(self) -> None:
        if self.position_mode not in POSITION_MODES:
            raise ConfigError(f"position_mode={self.position_mode!r} is not one of "
                              f"{POSITION_MODES}")
        if self.eos_mask_loss and self.eos_token_id is None:
            raise ConfigError("eos_mask_loss=True needs eos_token_id=<the tokenizer's EOS id>")
        if self.eos_token_id is not None and not self.eos_mask_loss:
            raise ConfigError("eos_token_id is only used with eos_mask_loss=True")
        for name in ("eos_mask_loss", "return_loss_mask", "return_num_valid_tokens"):
            if getattr(self, name) and not self.return_labels:
                raise ConfigError(f"{name}=True needs return_labels=True (it describes labels)")
        if not isinstance(self.ignore_index, int):
            raise ConfigError(f"ignore_index must be an int, got {self.ignore_index!r}")
        produced = set(self.produced_fields())
        for name in self.exclude_fields:
            if name not in produced:
                raise ConfigError(f"exclude_fields: {name!r} is not produced with these options "
                                  f"(produced: {sorted(produced)})")
        for source in self.rename_fields:
            if source not in produced:
                raise ConfigError(f"rename_fields: {source!r} is not produced with these "
                                  f"options (produced: {sorted(produced)})")
            if source in self.exclude_fields:
                raise ConfigError(f"rename_fields: {source!r} is also in exclude_fields")
        kept = [self.rename_fields.get(n, n) for n in self.produced_fields()
                if n not in self.exclude_fields]
        clashes = sorted({n for n in kept if kept.count(n) > 1})
        if clashes:
            raise ConfigError(f"rename_fields: more than one field would be named {clashes}")

    def produced_fields(self) -> list[str]:
        names = ["input_ids", "positions"]
        if self.return_labels:
            names.append("labels")
        if self.return_loss_mask:
            names.append("loss_mask")
        if self.return_num_valid_tokens:
            names.append("num_valid_tokens")
        if self.return_cu_seqlens:
            names += ["cu_seqlens", "max_seqlen"]
        if self.return_padding_mask:
            names.append("padding_mask")
        return names


def _stack(records: Sequence[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                                 np.ndarray | None]:
    """Tokens, positions, where the padding is (None: no row has any) and train masks (None:
    no row has one), each ``[B, S]``."""
    if not records:
        raise ConfigError("to_training: the batch has no records")
    first = records[0]
    if first.meta.get("packed_sequences"):
        raise ConfigError("to_training cannot convert pack_sequences output (each row is a list "
                          "of documents); use pack_flat, or build tensors from "
                          "record.payload['documents'] yourself")
    if "input_ids" not in first.payload:
        raise ConfigError("to_training needs token records (payload 'input_ids'): add "
                          "tokenize and pack_flat, or build tensors from the payloads yourself")
    lengths = {len(r.payload["input_ids"]) for r in records}
    if len(lengths) != 1:
        raise ConfigError(f"to_training needs rows of one length, got lengths {sorted(lengths)}; "
                          "use pack_flat to make fixed-length rows")
    tokens = np.array([r.payload["input_ids"] for r in records])  # rows of one length
    if "positions" in first.payload:
        positions = np.array([r.payload["positions"] for r in records])
    else:
        positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    width = tokens.shape[1]
    padding = [r.meta.get("padding", 0) for r in records]
    is_pad = None
    if any(padding):
        is_pad = np.arange(width)[None, :] >= (width - np.array(padding))[:, None]
    masks = None
    if any("train_mask" in r.payload for r in records):
        masks = np.stack([r.payload.get("train_mask", np.ones(width, dtype=bool))
                          for r in records])
    return tokens, positions, is_pad, masks


def to_training(records: Sequence[Record], options: TrainingOptions) -> dict[str, Any]:
    import torch

    tokens, positions, is_pad, masks = _stack(records)
    out: dict[str, Any] = {}
    if options.return_labels:
        if tokens.shape[1] < 2:
            raise ConfigError("return_labels needs rows of at least 2 tokens")
        inputs = tokens[:, :-1]
        labels = tokens[:, 1:].astype(np.int64)
        # valid stays None while every label counts (no padding, masks or EOS masking).
        valid = None if is_pad is None else ~is_pad[:, 1:]
        if masks is not None:
            valid = masks[:, 1:].copy() if valid is None else valid & masks[:, 1:]
        if options.eos_mask_loss:
            # Only the prediction that crosses into the next document: an EOS input whose
            # target starts a document. Tokenizers whose BOS is their EOS (GPT-2, Pythia)
            # still train BOS -> first token, and EOS ids inside a document stay trained.
            crossing = (inputs == options.eos_token_id) & (positions[:, 1:] == 0)
            valid = ~crossing if valid is None else valid & ~crossing
        if valid is not None:
            labels[~valid] = options.ignore_index
        positions = positions[:, :-1]
        if is_pad is not None:
            is_pad = is_pad[:, :-1]
        out["labels"] = labels
        if options.return_loss_mask:
            out["loss_mask"] = (np.ones(labels.shape, dtype=np.float32) if valid is None
                                else valid.astype(np.float32))
        if options.return_num_valid_tokens:
            out["num_valid_tokens"] = np.int64(labels.size if valid is None else valid.sum())
    else:
        inputs = tokens
    rows, width = inputs.shape
    doc_positions = positions
    if options.position_mode == "sequence":
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
    out["input_ids"] = inputs.astype(np.int64)
    out["positions"] = np.ascontiguousarray(positions, dtype=np.int64)
    if options.return_cu_seqlens:
        starts = doc_positions == 0
        starts[:, 0] = True
        if options.flatten:
            flat = np.flatnonzero(starts.ravel())
            cu = np.concatenate([flat, [rows * width]]).astype(np.int32)
            max_seqlen = int(np.diff(cu).max())
        else:
            per_row = [np.concatenate([np.flatnonzero(s), [width]]) for s in starts]
            longest = max(len(c) for c in per_row)
            cu = np.full((rows, longest), -1, dtype=np.int32)
            for i, c in enumerate(per_row):
                cu[i, :len(c)] = c
            max_seqlen = int(max(np.diff(c).max() for c in per_row))
        out["cu_seqlens"] = cu
        out["max_seqlen"] = np.int64(max_seqlen)
    if options.return_padding_mask:
        out["padding_mask"] = (np.zeros(inputs.shape, dtype=bool) if is_pad is None
                               else is_pad.copy())
    result: dict[str, Any] = {}
    for name in options.produced_fields():
        if name in options.exclude_fields:
            continue
        value = out[name]
        if options.flatten and name not in ("cu_seqlens", "max_seqlen", "num_valid_tokens"):
            value = value.reshape(-1)
        if np.ndim(value) == 0:
            tensor = torch.tensor(value.item(), dtype=torch.int64)
        else:
            value = np.ascontiguousarray(value)
            tensor = torch.from_numpy(value if value.flags.writeable else value.copy())
        result[options.rename_fields.get(name, name)] = tensor
    return result
