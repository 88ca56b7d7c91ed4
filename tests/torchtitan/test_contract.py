"""Batch contract on TorchTitan's real llama3 debug model (CPU, eager FlexAttention).

What ZephonDataLoader yields is fed the way TorchTitan 0.3.0's trainer feeds it: "input" as
the tokens, every other key as a forward kwarg, attention masks built from the positions.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from zephon_torchtitan.dataloader import ZephonDataLoader
from zephon_torchtitan.vocab import fit_model_vocab

DOC_A = ("Ventor kalo mishi rune tashi. Polo anel vendra quibel torsa monegra filu bethi. "
         "Corthi ulpra sendo xawin kalo mishi.")
DOC_B = "Anel vendra quibel torsa. Mishi rune tashi polo anel. Thi ulpra sendo."


@pytest.fixture(scope="module")
def model(demo_assets):
    from torchtitan.models.llama3 import model_registry

    from zephon.text.tokenizer import load_tokenizer

    config = model_registry("debugmodel").model
    fit_model_vocab(config, len(load_tokenizer(demo_assets["tokenizer"])))
    torch.manual_seed(0)
    with torch.device("meta"):
        built = config.build()
    built.to_empty(device="cpu")
    with torch.no_grad():
        built.init_weights(buffer_device=None)
    return built.eval()


def forward(model, input_dict: dict[str, torch.Tensor]) -> torch.Tensor:
    """TorchTitan 0.3.0's post_dataloading_process + forward, for the Flex backend."""
    extra = {k: v for k, v in input_dict.items() if k != "input"}
    extra["attention_masks"] = model.get_attention_masks(positions=extra["positions"])
    with torch.no_grad():
        return model(input_dict["input"], **extra)


def dataset(name: str, path: Path) -> str:
    return f'[[datasets]]\nname = "{name}"\npath = "{path}"\n'


def loader(recipe: Path, seq_len: int, rows: int, **options) -> ZephonDataLoader:
    return ZephonDataLoader.Config(recipe=str(recipe), **options).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=seq_len, local_batch_size=rows)


def test_position_resets_isolate_packed_documents(model, docs_dir, tmp_path, recipes):
    packed = recipes.write(tmp_path / "packed.toml", lanes=1, pack="first_fit",
                           datasets=dataset("ab", docs_dir([DOC_A, DOC_B], "ab")))
    alone = recipes.write(tmp_path / "alone.toml", lanes=1, pack="first_fit",
                          datasets=dataset("b", docs_dir([DOC_B], "b")))
    (ab_inputs, _), = list(loader(packed, 128, 1))
    (b_inputs, _), = list(loader(alone, 128, 1))
    positions = ab_inputs["positions"][0]
    start = int(torch.nonzero(positions == 0)[1])   # document B starts at the second reset
    length = int(torch.nonzero(b_inputs["positions"][0] == 0)[1])  # then padding starts
    assert start > 10 and length > 10
    assert torch.equal(ab_inputs["input"][0, start:start + length],
                       b_inputs["input"][0, :length])
    ab_logits = forward(model, ab_inputs)[0, start:start + length]
    b_logits = forward(model, b_inputs)[0, :length]
    torch.testing.assert_close(ab_logits, b_logits, rtol=1e-4, atol=1e-4)
    # The same row without the resets (continuous positions) lets B see A: logits differ.
    continuous = dict(ab_inputs, positions=torch.arange(128).unsqueeze(0))
    assert not torch.allclose(forward(model, continuous)[0, start:start + length], b_logits,
                              atol=1e-3)


def test_flattened_batch_equals_rows(model, tmp_path, recipes):
    recipe = recipes.write(tmp_path / "rows.toml", datasets=recipes.demo(), lanes=1)
    input_dict, labels = next(iter(loader(recipe, 128, 2)))
    assert input_dict["input"].shape == (1, 256) and labels.shape == (1, 256)
    rows = {k: v.view(2, 128) for k, v in input_dict.items()}
    flat_logits = forward(model, input_dict).view(2, 128, -1)
    torch.testing.assert_close(flat_logits, forward(model, rows), rtol=1e-4, atol=1e-4)


def test_only_accepted_keys_reach_forward(model, tmp_path, recipes):
    from torchtitan.models.common.decoder import Decoder

    recipe = recipes.write(tmp_path / "keys.toml", datasets=recipes.demo(), lanes=1)
    input_dict, labels = next(iter(loader(recipe, 128, 2)))
    accepted = set(inspect.signature(Decoder.forward).parameters) - {"self", "tokens"}
    assert set(input_dict) == {"input", "positions"}
    assert set(input_dict) - {"input"} <= accepted
    assert input_dict["input"].dtype == input_dict["positions"].dtype == torch.int64
    assert labels.dtype == torch.int64 and bool((labels == -100).any() | (labels >= 0).all())
    forward(model, input_dict)  # accepted as is
    with pytest.raises(TypeError, match="num_valid_tokens"):
        forward(model, {**input_dict, "num_valid_tokens": torch.tensor(1)})
