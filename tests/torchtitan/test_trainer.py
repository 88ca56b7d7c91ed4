"""ZephonTrainer and install_loaders: the loaders and metrics wired through the config alone."""

from __future__ import annotations

import ast
import gc
import os
from dataclasses import dataclass, fields
from pathlib import Path

from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from zephon_torchtitan.config_checks import PREFLIGHT_IMPORT, install_loaders
from zephon_torchtitan.config_registry import with_zephon
from zephon_torchtitan.dataloader import ZephonDataLoader
from zephon_torchtitan.metrics_processor import ZephonMetricsProcessor
from zephon_torchtitan.zephon_trainer import ZephonTrainer

ADAPTER = Path(__file__).resolve().parents[2] / "integrations" / "torchtitan" / "zephon_torchtitan"


def _loader(config, seq_len=64):
    return config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=None,
                                   seq_len=seq_len, local_batch_size=2)


def test_with_zephon_returns_a_zephon_trainer_config_and_leaves_the_environment_alone(
        tmp_path, recipes):
    recipe = recipes.write(tmp_path / "data.toml", datasets=recipes.demo(), lanes=4)
    environment = dict(os.environ)
    config = with_zephon(llama3_debugmodel(), str(recipe))
    assert dict(os.environ) == environment
    assert type(config) is ZephonTrainer.Config and config._owner is ZephonTrainer
    assert isinstance(config.dataloader, ZephonDataLoader.Config)
    assert PREFLIGHT_IMPORT not in config.override.imports  # the trainer installs them itself
    assert config.model_spec.model.vocab_size == 4096  # fitted to the demo tokenizer

    class CustomTrainer(Trainer):  # another trainer is kept, with the preflight override
        @dataclass(kw_only=True, slots=True)
        class Config(Trainer.Config):
            pass

    base = llama3_debugmodel()
    custom = CustomTrainer.Config(**{f.name: getattr(base, f.name) for f in fields(base)})
    kept = with_zephon(custom, str(recipe))
    assert kept is custom and PREFLIGHT_IMPORT in kept.override.imports


def test_each_trainer_config_links_its_metrics_to_its_own_training_loader(tmp_path, recipes):
    recipe = recipes.write(tmp_path / "data.toml", datasets=recipes.demo(), lanes=4)
    configs = []
    for _ in range(2):
        config = with_zephon(llama3_debugmodel(), str(recipe),
                             validation=str(recipe))
        config.training.seq_len, config.training.local_batch_size = 64, 2
        config.validator.enable = True
        installed = install_loaders(config)
        assert set(installed) == {"dataloader", "validator.dataloader"}
        assert isinstance(config.metrics, ZephonMetricsProcessor.Config)
        assert config.dataloader.metrics_link is config.metrics.loader_link
        assert config.validator.dataloader.metrics_link is None
        configs.append(config)
    first, second = (_loader(c) for c in configs)
    validation = configs[0].validator.dataloader.build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2)
    assert configs[0].metrics.loader_link.loader is first
    assert configs[1].metrics.loader_link.loader is second
    assert validation is not None and configs[0].metrics.loader_link.loader is first
    del first
    gc.collect()
    assert configs[0].metrics.loader_link.loader is None  # held weakly
    assert "LoaderLink(empty)" in repr(configs[0].metrics.loader_link)


def test_only_the_override_module_looks_at_the_call_stack():
    """TorchTitan's override API hands a factory one node; the override route alone finds
    the whole config on the stack. No module keeps a loader in a global."""
    found = {}
    for path in sorted(ADAPTER.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "currentframe"):
                found.setdefault(path.name, set()).add(node.attr)
            if isinstance(node, ast.Global):
                found.setdefault(path.name, set()).add("global")
    assert found == {"override.py": {"_getframe"}}
