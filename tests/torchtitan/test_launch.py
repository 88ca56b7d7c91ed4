"""The TOML launcher: a bad launch or data recipe fails before training starts, naming it."""

from __future__ import annotations

import pytest

from zephon import ConfigError
from zephon_torchtitan.train import main, prepare, read_launch_recipe

LAUNCH = """\
dump_folder = "out"
[base]
module = "llama3"
config = "llama3_debugmodel"
vocab_size = "tokenizer"
[training]
seq_len = 64
{training}
[dataloader]
name = "zephon"
recipe = "data.toml"
{loader}
"""


def launch(tmp_path, recipes, *, training="", loader="", **data):
    recipes.write(tmp_path / "data.toml", **{"datasets": recipes.demo(), **data})
    path = tmp_path / "launch.toml"
    path.write_text(LAUNCH.format(training=training, loader=loader))
    return prepare(read_launch_recipe(path), str(path), cpu=True)


def test_a_valid_launch_recipe_maps_onto_the_trainer_config(tmp_path, recipes, demo_assets):
    config = launch(tmp_path, recipes, training="steps = 3", loader="lanes = 2\nreport_every = 0")
    assert config.training.steps == 3 and config.training.seq_len == 64
    assert type(config.dataloader).__name__ == "Config"
    assert config.dataloader.recipe == str(tmp_path / "data.toml")
    assert config.hf_assets_path == demo_assets["tokenizer"]
    assert config.model_spec.model.vocab_size == 4096
    assert config.parallelism.spmd_backend == "partial_dtensor"  # CPU settings


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"training": "stepz = 3"}, "stepz"),
    ({"loader": "lanez = 2"}, "lanez"),
    ({"training": 'steps = "ten"'}, "training.steps"),
    ({"datasets": '[[datasets]]\nname = "gone"\npath = "no_such_dir"\n'}, "no_such_dir"),
    ({"tokenizer": "./no_such_tokenizer"}, "no_such_tokenizer"),
    ({"extra": "[unknown_section]\nx = 1"}, "unknown_section"),
])
def test_bad_recipes_fail_before_training_naming_the_culprit(tmp_path, recipes, kwargs, named):
    with pytest.raises(ConfigError, match=named):
        launch(tmp_path, recipes, **kwargs)


def test_launcher_arguments(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        main(["--toml", str(tmp_path / "missing.toml")])
    bad = tmp_path / "nobase.toml"
    bad.write_text("[training]\nsteps = 1\n")
    with pytest.raises(ConfigError, match=r"\[base\]"):
        main(["--toml", str(bad)])
    with pytest.raises(SystemExit):
        main(["--toml", str(bad), "--module", "llama3"])
