"""The entry module and the GPU check script on a machine without Megatron-LM or CUDA."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from megatron_helpers import PACKED, REPO, megatron_argv, parse

from zephon_megatron import pretrain_gpt
from zephon_megatron.arguments import settings_from_args
from zephon_megatron_tools import gpu_check


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.skipif(not pretrain_gpt.missing_megatron_lm(),
                    reason="a Megatron-LM checkout is on PYTHONPATH")
def test_entry_without_megatron_lm_says_what_to_install() -> None:
    result = run_module("zephon_megatron.pretrain_gpt", *megatron_argv(PACKED))
    assert result.returncode == 2
    assert "Megatron-LM" in result.stderr and "PYTHONPATH" in result.stderr
    missing = pretrain_gpt.missing_megatron_lm()  # 0.19 ships megatron.training, not the rest
    assert f"(missing: {', '.join(missing)})" in result.stderr


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
    result = run_module("zephon_megatron_tools.gpu_check", "--skip-pretrain")
    assert result.returncode == 0
    assert "CUDA is not available" in result.stdout and "nothing to check" in result.stdout


def broken_recipe(tmp_path) -> str:
    """Two datasets, one whose file lacks the text field; lanes 3; rows of 33 tokens."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.jsonl").write_text('{"body": "no text here"}\n')
    text = "lanes = 3\n" + PACKED.read_text().replace(
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
    assert "lanes = 3 in " in err  # the recipe's lanes, named as such
    assert "broken.toml: 3 lanes cannot be shared by 2 data-parallel readers" in err
    assert "[pack] max_length = 33 conflicts" in err or "max_length = 33 conflicts" in err
    assert "Megatron-LM" not in err  # refused before looking for the checkout


def test_smoke_refuses_a_broken_recipe_before_any_process(tmp_path) -> None:
    argv = megatron_argv(tmp_path / "x.toml")
    argv[argv.index("--zephon-recipe") + 1] = broken_recipe(tmp_path)
    result = run_module("zephon_megatron_tools.smoke", "--nproc", "2", "--workdir",
                        str(tmp_path / "w"), "--", *argv)
    assert result.returncode == 2
    assert "has no field 'text'" in result.stderr and "cannot be shared by 2" in result.stderr
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


megatron_training = pytest.mark.skipif(
    importlib.util.find_spec("megatron.training") is None,
    reason="Megatron-LM's parser (megatron.training) is not importable: megatron-core 0.19+ "
    "ships it (make test runs this under .venv-py312); for 0.16 put a checkout on PYTHONPATH")


@megatron_training
def test_gpu_check_dry_run_passes_megatron_parser() -> None:
    result = run_module("zephon_megatron_tools.gpu_check", "--dry-run", "--gpus", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "dry run: ok" in line]
    assert len(lines) == 2
    assert "data-parallel 4, lanes 8, eval every 2 x 1" in lines[0]
    assert "data-parallel 2, lanes 8" in lines[1]  # the resume at another size


@megatron_training
def test_parse_only_refuses_what_megatron_would_trip_on() -> None:
    flags = gpu_check.pretrain_commands("/tmp/x")[0][1]
    cut = flags.index("--eval-interval")
    result = run_module("zephon_megatron_tools.gpu_check", "--parse-only", "1", "--",
                        *flags[:cut], *flags[cut + 2:])
    assert result.returncode != 0 and "--train-iters needs --eval-interval" in result.stderr


def launch_flags(tmp_path, nodes: int) -> list[str]:
    """The Megatron flags recipes/megatron/launch_gpu_cluster.sh hands to the entry."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    fake = tmp_path / "bin" / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "args"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "ARGS_OUT": str(out), "MEGATRON_LM": "/megatron-lm", "SLURM_NNODES": str(nodes),
           "MASTER_ADDR": "node0", "CKPT": str(tmp_path / "ckpt")}
    script = REPO / "recipes" / "megatron" / "launch_gpu_cluster.sh"
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    argv = out.read_text().splitlines()
    return argv[argv.index("zephon_megatron.pretrain_gpt") + 1:]


@pytest.mark.parametrize("nodes", [1, 3, 5])
def test_the_cluster_launch_script_passes_the_checks_on_any_node_count(tmp_path,
                                                                       nodes: int) -> None:
    from zephon_megatron.arguments import build_standalone_parser

    flags = launch_flags(tmp_path, nodes)
    args, _ = build_standalone_parser().parse_known_args(flags)
    settings = settings_from_args(args, world_size=8 * nodes)
    assert settings.lanes == 8 * 4 * nodes  # 8 lanes per reader, TP 2 on 8 GPUs per node
    assert settings.dataloader_save == str(tmp_path / "ckpt")
    assert args.global_batch_size % (args.micro_batch_size * 4 * nodes) == 0


@megatron_training
def test_the_cluster_launch_script_passes_megatron_parser(tmp_path, monkeypatch) -> None:
    flags = launch_flags(tmp_path, 3)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the script exports it
    result = run_module("zephon_megatron_tools.gpu_check", "--parse-only", "24", "--", *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "data-parallel 12, lanes 96" in result.stdout
