"""Loader state files in the layout Megatron-LM's ``--dataloader-save`` writes.

``DIR/iter_<7 digits>/mp_rank_<tp>[_<pp>]/train_dataloader_dprank<dp>.pt``, one per
data-parallel rank, each ``{"dataloader_state_dict": state}``; ``DIR`` is ``--dataloader-save``
or, without it, the checkpoint directory (``--save`` writes, ``--load`` reads). Read by the
provider on resume and by the preflight, which checks a resume before the model is built.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from zephon.errors import StateMismatchError


def state_directories(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(where checkpoints write the loader state, where a resume reads it)."""
    explicit = getattr(args, "dataloader_save", None)
    if explicit:
        return explicit, explicit
    return getattr(args, "save", None), getattr(args, "load", None)


def checkpoint_iteration(load_dir: str | os.PathLike[str],
                         ckpt_step: int | None = None) -> int | None:
    """The iteration a resume from ``load_dir`` starts at: ``--ckpt-step``, else Megatron-LM's
    ``latest_checkpointed_iteration.txt`` (None: nothing to resume)."""
    if ckpt_step is not None:
        return int(ckpt_step)
    tracker = Path(load_dir) / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


def saved_lanes(state_dir: str | os.PathLike[str], load_dir: str | os.PathLike[str],
                ckpt_step: int | None = None) -> int | None:
    """The lanes of the loader state a resume from ``load_dir`` would read, or None."""
    iteration = checkpoint_iteration(load_dir, ckpt_step)
    if not iteration:
        return None
    from zephon.integration import read_state

    try:
        return read_state(read_dataloader_states(state_dir, iteration), str(state_dir)
                          ).lane_count
    except StateMismatchError:
        return None


def dataloader_state_path(save_dir: str | os.PathLike[str], iteration: int, dp_rank: int, *,
                          tp_rank: int = 0, pp_rank: int | None = None) -> Path:
    model_dir = f"mp_rank_{tp_rank:02d}" if pp_rank is None else \
        f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return (Path(save_dir) / f"iter_{iteration:07d}" / model_dir
            / f"train_dataloader_dprank{dp_rank:03d}.pt")


def write_dataloader_state(save_dir: str | os.PathLike[str], iteration: int, dp_rank: int,
                           state: dict[str, Any]) -> Path:
    """Write one rank's state as Megatron-LM does (for runs without Megatron-LM)."""
    path = dataloader_state_path(save_dir, iteration, dp_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".pt.partial")
    torch.save({"dataloader_state_dict": state}, partial)
    partial.replace(path)
    return path


def read_dataloader_states(save_dir: str | os.PathLike[str],
                           iteration: int) -> list[dict[str, Any]]:
    """The states every data-parallel rank wrote at ``iteration``."""
    base = Path(save_dir) / f"iter_{iteration:07d}"
    files = sorted(base.glob("mp_rank_*/train_dataloader_dprank*.pt"))
    if not files:
        raise StateMismatchError(
            f"no loader state for iteration {iteration}: nothing matches "
            f"{base}/mp_rank_*/train_dataloader_dprank*.pt. Was the checkpoint written with "
            "--dataloader zephon and the same --dataloader-save?")
    states = []
    for path in files:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or "dataloader_state_dict" not in blob:
            raise StateMismatchError(f"{path}: not a Megatron dataloader state file")
        states.append(blob["dataloader_state_dict"])
    return states
