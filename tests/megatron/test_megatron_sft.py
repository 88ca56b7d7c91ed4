"""The SFT recipe through the Megatron provider: loss only on assistant turns."""

from __future__ import annotations

import torch
from megatron_helpers import RECIPES, megatron_argv, parse

from zephon.recipe import DataRecipe
from zephon.text.tokenizer import load_tokenizer
from zephon_megatron.arguments import settings_from_args
from zephon_megatron.provider import Topology, build_iterator

SFT = RECIPES / "sft_chat.toml"


def test_sft_recipe_trains_only_assistant_turns() -> None:
    args = parse(megatron_argv(SFT, "--zephon-prefetch", "0",
                               masking=["--reset-position-ids", "--reset-attention-mask"]))
    recipe = DataRecipe.from_toml(SFT)
    batch = next(build_iterator(recipe, settings_from_args(args), Topology()))
    tokenizer = load_tokenizer(recipe.tokenize["tokenizer"])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    mask = batch["loss_mask"].bool()
    assert 0 < mask.float().mean() < 0.7
    # Every end-of-turn token that closes an assistant reply is a target; user turns are not.
    targets = batch["labels"][mask]
    assert (targets == im_end).any()
    text = tokenizer.decode(batch["labels"][mask].tolist())
    assert "<|im_start|>" not in text and "user" not in text
    assert batch["cu_seqlens"].dtype == torch.int32
