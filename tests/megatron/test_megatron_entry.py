"""The entry module and the GPU check script on a machine without Megatron-LM or CUDA."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from megatron_helpers import PACKED, megatron_argv, parse

from zephon_megatron import gpu_check, pretrain_gpt
from zephon_megatron.arguments import settings_from_args


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.skipif(importlib.util.find_spec("megatron.training") is not None,
                    reason="Megatron-LM is on PYTHONPATH")
def test_entry_without_megatron_lm_says_what_to_install() -> None:
    result = run_module("zephon_megatron.pretrain_gpt", *megatron_argv(PACKED))
    assert result.returncode == 2
    assert "Megatron-LM" in result.stderr and "PYTHONPATH" in result.stderr
    assert "megatron.training" in result.stderr


@pytest.mark.skipif(bool(pretrain_gpt.missing_megatron_lm()),
                    reason="needs a Megatron-LM checkout on PYTHONPATH")
def test_entry_rejects_a_conflict_before_pretrain(capsys) -> None:
    assert pretrain_gpt.main(megatron_argv(PACKED, masking=["--reset-position-ids"])) == 2
    assert "--reset-attention-mask" in capsys.readouterr().err


def test_entry_defaults_megatron_to_the_recipe_tokenizer() -> None:
    settings = settings_from_args(parse(megatron_argv(PACKED)))
    assert pretrain_gpt.zephon_args_defaults(settings, []) == {
        "tokenizer_type": "NullTokenizer", "vocab_size": 4096}
    assert pretrain_gpt.zephon_args_defaults(settings, ["--tokenizer-type", "X"]) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: run the real check")
def test_gpu_check_exits_cleanly_without_cuda() -> None:
    assert gpu_check.unavailable() == "CUDA is not available on this machine"
    result = run_module("zephon_megatron.gpu_check", "--skip-pretrain")
    assert result.returncode == 0
    assert "CUDA is not available" in result.stdout and "nothing to check" in result.stdout


def broken_recipe(tmp_path) -> str:
    """Two datasets, one whose file lacks the text field; lanes 3; rows of 33 tokens."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.jsonl").write_text('{"body": "no text here"}\n')
    text = PACKED.read_text().replace("lanes = 8", "lanes = 3").replace(
        '\n[tokenize]\n', '\n[[datasets]]\nname = "other"\npath = "other"\n\n[tokenize]\n').replace(
        'algorithm = "wrap"', 'algorithm = "wrap"\nmax_length = 33')
    path = tmp_path / "broken.toml"
    path.write_text(text)
    return str(path)


def test_entry_checks_the_recipes_before_megatron_lm_is_imported(tmp_path, capsys) -> None:
    argv = megatron_argv(tmp_path / "x.toml")
    argv[argv.index("--zephon-recipe") + 1] = broken_recipe(tmp_path)
    argv += ["--tensor-model-parallel-size", "2"]
    env = dict(os.environ, WORLD_SIZE="4")  # data-parallel size 2
    result = subprocess.run([sys.executable, "-m", "zephon_megatron.pretrain_gpt", *argv],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2
    err = result.stderr
    assert "zephon preflight found problems before the model is built" in err
    assert "a.jsonl: has no field 'text'" in err
    assert "lanes = 3 is not divisible by the data-parallel size 2" in err
    assert "[pack] max_length = 33 conflicts" in err or "max_length = 33 conflicts" in err
    assert "Megatron-LM" not in err  # refused before looking for the checkout


def test_smoke_refuses_a_broken_recipe_before_any_process(tmp_path) -> None:
    argv = megatron_argv(tmp_path / "x.toml")
    argv[argv.index("--zephon-recipe") + 1] = broken_recipe(tmp_path)
    result = run_module("zephon_megatron.smoke", "--nproc", "2", "--workdir",
                        str(tmp_path / "w"), "--", *argv)
    assert result.returncode == 2
    assert "has no field 'text'" in result.stderr and "divisible" in result.stderr
    assert not (tmp_path / "w").exists()  # no rank was started


def test_vocabulary_and_enum_problems_are_named_before_the_model(tmp_path) -> None:
    argv = megatron_argv(PACKED, "--vocab-size", "1024")
    result = run_module("zephon_megatron.pretrain_gpt", *argv)
    assert result.returncode == 2
    assert "has 4096 tokens but the model's vocabulary has 1024" in result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(PACKED.read_text().replace('repeat = ["demo"]',
                                              'repeat = ["demo"]\non_exhausted = "drian"'))
    argv = megatron_argv(PACKED)
    argv[argv.index("--zephon-recipe") + 1] = str(bad)
    result = run_module("zephon_megatron.pretrain_gpt", *argv)
    assert result.returncode == 2
    assert "bad.toml: [mixture] on_exhausted='drian'" in result.stderr
    assert "Megatron-LM" not in result.stderr
