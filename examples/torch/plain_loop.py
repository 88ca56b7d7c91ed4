"""A plain PyTorch training loop on a data recipe: ``python examples/torch/plain_loop.py``.

A two-layer token model (an embedding and a linear head) trained with AdamW on the recipe's
microbatches, the data state saved with the model and resumed from it: the loop any trainer
writes, with :class:`ZephonIterableDataset` as its data. Under ``torchrun`` every process is a
data-parallel reader (gloo); the model is not synchronised, the data is what is shown.

    python examples/torch/plain_loop.py --recipe recipes/torch/pretrain.toml --steps 20 \\
        --save /tmp/run/step20.pt
    python examples/torch/plain_loop.py --recipe recipes/torch/pretrain.toml --steps 10 \\
        --resume /tmp/run/step20.pt

Prints one line a step: the step, the loss and the microbatch's tokens that carry a label.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader

from zephon.recipe import DataRecipe
from zephon.text.tokenizer import load_tokenizer
from zephon_torch import ZephonIterableDataset


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/torch/plain_loop.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/torch/pretrain.toml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save", help="write the model, optimizer and data state here")
    parser.add_argument("--resume", help="a file --save wrote: go on from it")
    args = parser.parse_args(argv)
    owns_group = "RANK" in os.environ and not torch.distributed.is_initialized()
    if owns_group:
        torch.distributed.init_process_group("gloo")
    recipe = DataRecipe.from_toml(args.recipe)
    dataset = ZephonIterableDataset(recipe, infinite=True)
    vocab = len(load_tokenizer(recipe.tokenizer))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.resume:
        saved = torch.load(args.resume, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        dataset.load_state_dict(saved["data"])
    loader = DataLoader(dataset, batch_size=None)
    for step, item in zip(range(1, args.steps + 1), loader, strict=False):
        logits = model(item["input_ids"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 item["labels"].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        labelled = int((item["labels"] != -100).sum())
        print(f"step {step} loss {loss.item():.4f} labelled tokens {labelled}", flush=True)
    if args.save:
        os.makedirs(os.path.dirname(os.path.abspath(args.save)), exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "data": dataset.state_dict()}, args.save)
    if owns_group:  # a caller's own group is the caller's to end
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
