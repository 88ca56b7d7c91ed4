"""The override route's claims on a stock config, applied in process as the trainer does."""

from __future__ import annotations

import json

import pytest
import torch.distributed.checkpoint as dcp
from torchtitan.config.manager import ConfigManager
from torchtitan.config.override import apply_overrides

from zephon import ConfigError
from zephon_torchtitan.dataloader import ZephonDataLoader


def stock_config(*overrides: tuple[str, str], args: tuple[str, ...] = ()):
    imports = [f"zephon_torchtitan.override.{name}=" + json.dumps({"recipe": recipe})
               for name, recipe in overrides]
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel",
                                         "--validator.enable", *args,
                                         "--override.imports", *imports])
    return config, type(config.validator.dataloader)


def test_the_training_override_leaves_the_validation_loader_alone(tmp_path, small_tokenizer,
                                                                 recipes):
    """Without ``fqns`` an override of the loader class would take ``validator.dataloader``
    too, and validation would run on the training recipe."""
    train = recipes.write(tmp_path / "train.toml", datasets=recipes.demo(), lanes=2,
                          tokenizer=small_tokenizer)
    config, stock = stock_config(("zephon_dataloader", str(train)))
    replaced = apply_overrides(config.override, config)
    assert isinstance(config.dataloader, ZephonDataLoader.Config)
    assert config.dataloader.recipe == str(train)
    assert type(config.validator.dataloader) is stock and stock is not ZephonDataLoader.Config
    assert len(replaced) == 1 and "dataloader" in replaced[0]


def test_both_overrides_give_each_loader_its_own_recipe(tmp_path, small_tokenizer, recipes):
    train = recipes.write(tmp_path / "train.toml", datasets=recipes.demo(), lanes=2,
                          tokenizer=small_tokenizer)
    held_out = recipes.write(tmp_path / "valid.toml", datasets=recipes.demo("held_out"),
                             lanes=1, tokenizer=small_tokenizer)
    config, _ = stock_config(("zephon_dataloader", str(train)),
                             ("zephon_validation_dataloader", str(held_out)))
    apply_overrides(config.override, config)
    assert config.dataloader.recipe == str(train)
    assert isinstance(config.validator.dataloader, ZephonDataLoader.Config)
    assert config.validator.dataloader.recipe == str(held_out)


def test_open_lanes_that_a_resume_cannot_divide_are_refused_before_the_model(
        tmp_path, small_tokenizer, recipes, monkeypatch):
    """The preflight gives open lanes the value the loader will (those of the checkpoint to
    resume), so a data-parallel size they do not divide fails before the model is built."""
    train = recipes.write(tmp_path / "train.toml", datasets=recipes.demo(), lanes=2,
                          tokenizer=small_tokenizer)
    train.write_text(train.read_text().replace("lanes = 2\n", ""))
    config, _ = stock_config(("zephon_dataloader", str(train)),
                             args=("--checkpoint.enable", "--dump_folder", str(tmp_path / "out")))
    lanes = {f"lane_{lane}": b"" for lane in range(16)}
    dcp.save({"dataloader": lanes}, checkpoint_id=str(tmp_path / "out" / "checkpoint" / "step-3"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"lanes = 16: 16 lanes cannot be shared by 3 "
                       r"data-parallel readers.*\(\[1, 2, 4, 8, 16\]\)"):
        apply_overrides(config.override, config)
    monkeypatch.setenv("WORLD_SIZE", "4")
    apply_overrides(config.override, config)
    assert config.dataloader.checkpoint_folder == str(tmp_path / "out" / "checkpoint")
