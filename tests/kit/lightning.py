"""The recipe and the tiny model the Lightning tests train."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lightning as L
import torch

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "torch" / "pretrain.toml"


class TinyModel(L.LightningModule):
    """An embedding and a head: a loss on each microbatch, and what it trained on."""

    def __init__(self, vocab: int = 4096):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
        self.seen: list[str] = []
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        assert "zephon_state" not in batch and "labels" in batch
        self.seen.append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16])
        logits = self.net(batch["input_ids"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                 ignore_index=-100)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
