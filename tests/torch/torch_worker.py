"""One reader of a zephon_torch test job, run as its own process.

``python torch_worker.py CONFIG.json``; CONFIG holds ``mode`` ("loop": a plain loop with
torch.distributed over a file store; "accelerate": an ``accelerate`` loop), ``recipe``,
``seq_len``, ``save_after`` (items, or null), ``save_to``, ``load_from`` (or null) and
``out``. The reader writes ``{"digests": [...], "losses": [...]}`` to ``out`` with ``.rank<r>``
appended, and its state (after ``save_after`` items) to ``save_to``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch


def digest(item: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(item):
        h.update(key.encode())
        h.update(item[key].numpy().tobytes())
    return h.hexdigest()[:16]


class TinyModel(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 16)
        self.out = torch.nn.Linear(16, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(input_ids))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               item: dict[str, torch.Tensor], backward=None) -> float:
    logits = model(item["input_ids"])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), item["labels"].flatten(),
                                             ignore_index=-100)
    optimizer.zero_grad()
    (backward or torch.Tensor.backward)(loss)
    optimizer.step()
    return float(loss)


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    torch.manual_seed(0)
    from zephon_torch import ZephonIterableDataset

    if config["mode"] == "loop":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{config['store']}",
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        rank = dist.get_rank()
        dataset = ZephonIterableDataset(config["recipe"], seq_len=config["seq_len"])
        model = TinyModel(config["vocab"])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        if config.get("load_from"):
            dataset.load_state_dict(json.loads(Path(config["load_from"]).read_text()))
        backward, save = None, lambda directory: _save_rank_state(dataset, directory, rank)
    else:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        rank = accelerator.process_index
        dataset = ZephonIterableDataset(config["recipe"], seq_len=config["seq_len"],
                                        state_scope="job")
        model = TinyModel(config["vocab"])
        model, optimizer = accelerator.prepare(model,
                                               torch.optim.SGD(model.parameters(), lr=0.5))
        accelerator.register_for_checkpointing(dataset)
        if config.get("load_from"):
            accelerator.load_state(config["load_from"])
        backward, save = accelerator.backward, accelerator.save_state

    digests, losses = [], []
    for n, item in enumerate(torch.utils.data.DataLoader(dataset, batch_size=None), 1):
        digests.append(digest(item))
        losses.append(train_step(model, optimizer, item, backward))
        if n == config.get("save_after"):
            save(config["save_to"])
    with open(f"{config['out']}.rank{rank}", "w") as f:
        json.dump({"digests": digests, "losses": losses}, f)


def _save_rank_state(dataset, directory: str, rank: int) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
        json.dump(dataset.state_dict(), f)


if __name__ == "__main__":
    main()
