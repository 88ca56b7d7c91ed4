"""Each TorchTitan launch route reads its data recipe and lists each dataset once per process
(they were read 4-7 times: the config, the preflight, the vocabulary and the loader)."""

from __future__ import annotations

import pytest

from tests.torchtitan.test_preflight import LAUNCH
from zephon_torchtitan.demo import run_training

pytestmark = pytest.mark.slow

CPU = ["--training.disable_cuda_graphs", "--parallelism.spmd_backend", "partial_dtensor"]


def assert_once_per_process(counts: dict, recipes: int) -> None:
    assert counts, "no process counted anything"
    for pid, lines in counts.items():
        assert all(n == 1 for n in lines.values()), (pid, lines)
    assert any(sum(1 for line in lines if line.startswith("recipe ")) == recipes
               for lines in counts.values()), counts


def test_the_launcher_route(tmp_path, recipes, read_counts):
    recipes.write(tmp_path / "data.toml", datasets=recipes.demo())
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"'))
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml")], cwd=tmp_path,
                                   timeout=300)
    assert code == 0, output[-3000:]
    assert_once_per_process(read_counts(), recipes=1)


def test_the_config_registry_route(tmp_path, read_counts):
    """The registry's config names a training and a validation recipe."""
    code, output, _ = run_training(
        ["-m", "torchtitan.train", "--module", "zephon_torchtitan", "--config",
         "zephon_llama3_debugmodel", "--training.steps", "2", "--checkpoint.no-enable",
         "--dump_folder", str(tmp_path / "out")],
        cwd=tmp_path, module="zephon_torchtitan.cpu_shims", torchrun=True, timeout=300)
    assert code == 0, output[-3000:]
    assert_once_per_process(read_counts(), recipes=2)


def test_the_override_route(tmp_path, recipes, read_counts):
    data = recipes.write(tmp_path / "data.toml", datasets=recipes.demo())
    code, output, _ = run_training(
        ["-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel",
         "--override.imports", "zephon_torchtitan.override.zephon_dataloader="
         f'{{"recipe": "{data}", "fit_vocab": true}}', "--training.seq_len", "64",
         "--training.steps", "2", *CPU, "--validator.no-enable", "--checkpoint.no-enable",
         "--dump_folder", str(tmp_path / "out")],
        cwd=tmp_path, module="zephon_torchtitan.cpu_shims", torchrun=True, timeout=300)
    assert code == 0, output[-3000:]
    assert_once_per_process(read_counts(), recipes=1)
