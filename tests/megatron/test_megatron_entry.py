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
