"""Megatron-LM's pretrain() with --dataloader zephon reads the data recipe, builds a
--data-path blend and lists each dataset once per process (the entry, the preflight, the
provider and the loss all ask for them; a blend was listed 10 times)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from megatron_helpers import NEEDS_PRETRAIN, PACKED

pytestmark = [pytest.mark.multiprocess, NEEDS_PRETRAIN]

MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
         "--seq-length", "64", "--max-position-embeddings", "64", "--lr", "3e-3",
         "--train-iters", "2", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--reset-position-ids", "--reset-attention-mask", "--calculate-per-token-loss",
         "--dataloader", "zephon", "--eval-iters", "0", "--eval-interval", "2"]


def pretrain(*flags: str) -> None:
    run = subprocess.run([sys.executable, "-m", "zephon_megatron_tools.cpu_pretrain",
                          "--nproc", "1", "--timeout", "300", "--", *MODEL, *flags],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]


def assert_once_per_process(counts: dict) -> None:
    assert any(any(line.startswith("listing ") for line in lines) for lines in counts.values())
    for pid, lines in counts.items():
        assert all(n == 1 for n in lines.values()), (pid, lines)


def test_a_recipe_is_read_and_listed_once(read_counts):
    pretrain("--eod-mask-loss", "--zephon-recipe", str(PACKED))
    counts = read_counts()
    assert_once_per_process(counts)
    assert any(f"recipe {PACKED}" in lines for lines in counts.values())


def test_a_data_path_blend_is_built_and_listed_once(tmp_path: Path, read_counts):
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "zephon_megatron_tools.smoke", "--write-indexed-demo",
                    str(data)], check=True, capture_output=True, timeout=300)
    pretrain("--data-path", "0.7", str(data / "web_text_document"), "0.3",
             str(data / "code_text_document"), "--split", "98,2,0", "--vocab-size", "4096")
    assert_once_per_process(read_counts())
