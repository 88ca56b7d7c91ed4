"""The data recipes checked against a Megatron run before ``pretrain()`` builds the model.

:func:`~zephon_megatron.arguments.settings_from_args` runs :func:`recipe_problems` on the
training, validation and test recipes wherever it reads a command line: in the entry
(``python -m zephon_megatron.pretrain_gpt``, before Megatron-LM is imported), in the CPU smoke
run (before any process starts) and in the provider. It lists every problem with the others
of the command line: fields in every file, tokenizer vs ``--vocab-size``, lanes vs the
data-parallel size, ``[pack] max_length`` vs ``--seq-length + 1``, ``[batch]
microbatch_size`` vs ``--micro-batch-size``. The data-parallel size is ``world_size /
(tensor x pipeline x context parallel)``, ``world_size`` from ``WORLD_SIZE`` unless given.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def data_parallel_size(args: argparse.Namespace, world_size: int | None = None) -> int:
    """``world_size`` (default ``WORLD_SIZE``) over tensor x pipeline x context parallel."""
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    model_ways = (max(1, getattr(args, "tensor_model_parallel_size", 1) or 1)
                  * max(1, getattr(args, "pipeline_model_parallel_size", 1) or 1)
                  * max(1, getattr(args, "context_parallel_size", 1) or 1))
    return max(1, world // model_ways)


FLAGS = {"seq_len": "--seq-length", "microbatch_size": "--micro-batch-size",
         "vocab_size": "--vocab-size"}
"""The Megatron flags behind each run value, named in conflicts."""


def recipe_problems(args: argparse.Namespace, recipes: dict[str, Any], lanes: int | None,
                    world_size: int | None = None) -> list[str]:
    """Every problem of ``recipes`` (train/valid/test; None skipped) in this run."""
    from zephon.preflight import check_recipe

    dp = data_parallel_size(args, world_size)
    problems: list[str] = []
    seen: set[int] = set()
    for role, recipe in recipes.items():
        if recipe is None or id(recipe) in seen:
            continue  # the test split may read the validation recipe again
        seen.add(id(recipe))
        if lanes is not None:
            recipe.lanes = lanes
        for problem in check_recipe(recipe, world_size=dp, seq_len=args.seq_length,
                                    microbatch_size=args.micro_batch_size,
                                    vocab_size=getattr(args, "vocab_size", None),
                                    flags=FLAGS):
            problems.append(f"[{role}] {problem}")
    return problems
