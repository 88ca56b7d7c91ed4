"""A Lightning run for the tests: ``python ddp_worker.py OUT DEVICES STEPS [CKPT]`` trains
TinyModel on the torch recipe with DDP over DEVICES CPU processes, writes each rank's
microbatch digests to OUT/rank<r>.txt, and checkpoints every 3 steps into OUT/ckpt."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.kit.lightning import RECIPE, TinyModel
from zephon_lightning import ZephonDataModule


def main() -> None:
    out, devices, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ckpt = sys.argv[4] if len(sys.argv) > 4 else None
    model = TinyModel()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=devices,
                        strategy="ddp" if devices > 1 else "auto", logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1,
                                                   every_n_train_steps=3)])
    trainer.fit(model, datamodule=ZephonDataModule(RECIPE), ckpt_path=ckpt)
    (out / f"rank{trainer.global_rank}.txt").write_text("\n".join(model.seen) + "\n")


if __name__ == "__main__":
    main()
