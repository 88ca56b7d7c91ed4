"""zephon_lightning with the real Lightning: a Trainer's checkpoint resumes the data exactly,
the batch Lightning's fetcher took ahead of the checkpoint included."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.kit.lightning import RECIPE, TinyModel
from zephon.integration import read_state
from zephon_lightning import ZephonDataModule

REPO = Path(__file__).resolve().parents[2]


def fit(tmp_path: Path, steps: int, ckpt_path: str | None = None,
        workers: int = 0) -> tuple[TinyModel, ZephonDataModule]:
    model, data = TinyModel(), ZephonDataModule(RECIPE, workers=workers)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1,
                                                   every_n_train_steps=3)])
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model, data


@pytest.mark.parametrize("workers", [0, 1])
def test_a_checkpoint_resumes_the_data_exactly(tmp_path, workers):
    straight, _ = fit(tmp_path / "a", 8, workers=workers)
    assert len(straight.seen) == 8 and len(set(straight.seen)) == 8
    [checkpoint] = (tmp_path / "a" / "ckpt").glob("*step=3.ckpt")
    saved = torch.load(checkpoint, weights_only=False)["ZephonDataModule"]["loader"]
    assert saved["artifact"] == "loader_state" and saved["scope"] == "job"
    assert sorted(read_state(saved, "checkpoint").entries) == [f"lane_{n}" for n in range(4)]
    resumed, _ = fit(tmp_path / "b", 8, ckpt_path=str(checkpoint), workers=workers)
    assert resumed.seen == straight.seen[3:]
    assert resumed.losses == pytest.approx(straight.losses[3:], abs=0, rel=1e-6)


def run(out: Path, devices: int, steps: int, ckpt: str | None = None) -> list[list[str]]:
    """A DDP run in its own processes (Lightning starts the other ranks); each rank's
    digests in order."""
    import os
    import subprocess
    import sys

    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("ddp_worker.py")),
                             str(out), str(devices), str(steps), *([ckpt] if ckpt else [])],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return [(out / f"rank{r}.txt").read_text().split() for r in range(devices)]


@pytest.mark.multiprocess
def test_two_ranks_checkpoint_and_one_resumes_their_global_order(tmp_path):
    """Rank r of 2 trains global microbatches 2k + r (4 lanes); the step-3 checkpoint, which
    rank 0 writes with every rank's lanes, resumes at one rank on microbatch 6."""
    two = run(tmp_path / "two", 2, 6)
    global_order = [digest for pair in zip(*two, strict=True) for digest in pair]
    [checkpoint] = (tmp_path / "two" / "ckpt").glob("*step=3.ckpt")
    [one] = run(tmp_path / "one", 1, 6, str(checkpoint))
    assert len(one) == 3 and one == global_order[6:9]
