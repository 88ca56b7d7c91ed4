"""The SFT recipe through ZephonDataLoader: labels only on assistant turns."""

from __future__ import annotations

from pathlib import Path

import torch

from zephon.recipe import DataRecipe
from zephon.text.tokenizer import load_tokenizer
from zephon_torchtitan.dataloader import ZephonDataLoader

SFT = Path(__file__).resolve().parents[2] / "recipes" / "torchtitan" / "data" / "sft_chat.toml"


def test_sft_recipe_labels_only_assistant_turns():
    loader = ZephonDataLoader.Config(recipe=str(SFT)).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=96, local_batch_size=2)
    inputs, labels = next(iter(loader))
    tokenizer = load_tokenizer(DataRecipe.from_toml(SFT).tokenize["tokenizer"])
    trained = labels[labels != -100]
    assert 0 < trained.numel() < 0.7 * labels.numel()
    assert (trained == tokenizer.convert_tokens_to_ids("<|im_end|>")).any()
    text = tokenizer.decode(trained.tolist())
    assert "<|im_start|>" not in text and "system" not in text
    assert set(inputs) == {"input", "positions"}
    assert bool((inputs["positions"][0, 0] == 0).item()) and inputs["input"].dtype == torch.int64
