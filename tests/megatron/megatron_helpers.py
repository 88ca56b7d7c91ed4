"""Shared helpers of the Megatron adapter tests: recipe paths and command lines."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_megatron.pretrain_gpt import missing_megatron_lm

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "megatron"
PACKED = RECIPES / "pretrain_packed.toml"
CONTINUOUS = RECIPES / "pretrain_continuous.toml"
VALIDATION = RECIPES / "validation.toml"
PACKED_FLAGS = ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]
NEEDS_PRETRAIN = pytest.mark.skipif(bool(missing_megatron_lm()), reason=(
    f"Megatron-LM's pretrain() is not importable (missing: {', '.join(missing_megatron_lm())}"
    "): megatron-core 0.19+ ships it; for 0.16 put a core_v0.16.1 checkout on PYTHONPATH"))
"""Skips a test that runs Megatron-LM's own pretrain() where it cannot be imported."""


def megatron_argv(recipe: Path = PACKED, *extra: str, seq: int = 64, mbs: int = 2,
                  masking: list[str] | None = None) -> list[str]:
    """A --dataloader zephon command line (Megatron flag names), evaluation off."""
    flags = PACKED_FLAGS if masking is None else masking
    return ["--seq-length", str(seq), "--micro-batch-size", str(mbs), "--global-batch-size",
            str(4 * mbs), "--calculate-per-token-loss", "--transformer-impl", "local",
            "--eval-iters", "0", "--dataloader", "zephon", "--zephon-recipe", str(recipe),
            *flags, *extra]


def parse(argv: list[str]) -> argparse.Namespace:
    from zephon_megatron.arguments import build_standalone_parser

    return build_standalone_parser().parse_args(argv)




def cpu_pretrain(nproc: int, trace: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Megatron-LM's pretrain() on CPU (zephon_megatron_tools.cpu_pretrain), each rank's microbatch
    digests written under ``trace``."""
    command = [sys.executable, "-m", "zephon_megatron_tools.cpu_pretrain", "--nproc", str(nproc),
               "--trace", str(trace), "--timeout", "400", "--", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=450)


def digests(trace: Path) -> dict[int, str]:
    """{global microbatch: digest} of a cpu_pretrain trace; every microbatch read once."""
    out: dict[int, str] = {}
    for path in sorted(trace.glob("trace_rank*.json")):
        for record in json.loads(path.read_text()):
            assert record["global_microbatch"] not in out, "two ranks read one microbatch"
            out[record["global_microbatch"]] = record["digest"]
    return out
