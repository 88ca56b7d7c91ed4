"""Every training batch checked before the trainer takes it.

``SampleBatch.to_training`` builds the tensors; an adapter that hands them to a framework
can check each batch on the way (``check_training_batch``): the shapes, labels that never
count on padding, a valid-token count equal to the labels that count, and positions that
start each row at 0 and grow by one or restart at 0 (a document boundary) below the row
length. Each check is one vectorized pass over a ``[rows, width]`` tensor: cheap next to a
training step (measured: docs/measurements.md, the TorchTitan adapter's ``check_batches``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def training_batch_problems(out: Mapping[str, Any], rows: int, width: int,
                            ignore_index: int = -100) -> list[str]:
    """What is wrong with the training tensors ``out`` of ``rows`` rows of ``width`` tokens
    (``labels``, ``positions``, ``padding_mask``, ``num_valid_tokens``, as
    ``to_training`` names them); empty when nothing is."""
    labels = out["labels"].reshape(rows, width)
    positions = out["positions"].reshape(rows, width)
    padding = out["padding_mask"].reshape(rows, width)
    problems = []
    if labels.shape != positions.shape or labels.numel() != rows * width:
        problems.append(f"shape {tuple(labels.shape)} is not {rows} x {width}")
    if bool((labels[padding] != ignore_index).any()):
        problems.append("a padding position has a label that counts")
    valid, counted = int((labels != ignore_index).sum()), int(out["num_valid_tokens"].sum())
    if valid != counted:
        problems.append(f"num_valid_tokens={counted} but {valid} labels count")
    if bool((positions[:, 0] != 0).any()):
        problems.append("a row does not start at position 0")
    step_ok = (positions[:, 1:] == positions[:, :-1] + 1) | (positions[:, 1:] == 0)
    if not bool(step_ok.all()):
        problems.append("positions neither grow by one nor restart at 0")
    if bool((positions >= width).any()) or bool((positions < 0).any()):
        problems.append(f"a position is outside [0, {width})")
    return problems


def check_training_batch(out: Mapping[str, Any], rows: int, width: int,
                         ignore_index: int = -100) -> None:
    """Raise a RuntimeError naming every problem :func:`training_batch_problems` finds."""
    problems = training_batch_problems(out, rows, width, ignore_index)
    if problems:
        raise RuntimeError("zephon: malformed training batch: " + "; ".join(problems))
