"""Megatron-LM's own pretrain() on CPU with --dataloader zephon: train with evaluation, save,
resume at another data-parallel size, and compare the data token for token.

Needs what ``pretrain()`` imports: megatron-core 0.19+ ships ``megatron.training`` (make test
runs this file under .venv-py312); for 0.16 put a Megatron-LM core_v0.16.1 checkout (with six
and triton) on PYTHONPATH.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from megatron_helpers import NEEDS_PRETRAIN, PACKED, VALIDATION, digests
from megatron_helpers import cpu_pretrain as run_cpu_pretrain

pytestmark = [pytest.mark.multiprocess, NEEDS_PRETRAIN]

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "64", "--max-position-embeddings", "64", "--lr", "3e-3",
         "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
         "--lr-decay-iters", "6", "--seed", "1234", "--log-interval", "1"]
DATA = ["--micro-batch-size", "2", "--global-batch-size", "8", "--reset-position-ids",
        "--reset-attention-mask", "--eod-mask-loss", "--calculate-per-token-loss",
        "--dataloader", "zephon", "--zephon-recipe", str(PACKED),
        "--zephon-valid-recipe", str(VALIDATION), "--eval-interval", "2", "--eval-iters", "1"]


def cpu_pretrain(nproc: int, trace: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cpu_pretrain(nproc, trace, *MODEL, *DATA, *flags)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank, 6 iterations, a checkpoint at iteration 4; its trace is under ``one/``."""
    tmp_path = tmp_path_factory.mktemp("pretrain")
    ckpt = tmp_path / "ckpt"
    first = cpu_pretrain(1, tmp_path / "one", "--train-iters", "6", "--save", str(ckpt),
                         "--save-interval", "4")
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-6000:]
    assert "validation loss at iteration 2" in log and "iteration        6/       6" in log
    assert log.count("zephon: end of run (") == 1  # after a normal finish of pretrain()
    # no --dataloader-save: the loader state is part of the checkpoint
    assert (ckpt / "iter_0000004" / "mp_rank_00" / "train_dataloader_dprank000.pt").is_file()
    return tmp_path


def test_pretrain_evaluates_saves_and_resumes_at_another_dp_size_exactly(
        uninterrupted: Path, tmp_path: Path) -> None:
    ckpt = uninterrupted / "ckpt"
    resumed = cpu_pretrain(2, tmp_path / "two", "--train-iters", "6", "--load", str(ckpt),
                           "--ckpt-step", "4", "--save", str(tmp_path / "ckpt2"),
                           "--save-interval", "100")
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert "iteration        5/       6" in log and "validation loss at iteration 6" in log
    assert log.count("zephon: end of run (") == 1  # two ranks: rank 0 alone reports

    straight, after = digests(uninterrupted / "one"), digests(tmp_path / "two")
    assert sorted(straight) == list(range(24))  # 6 steps x 4 microbatches
    assert sorted(after) == list(range(16, 24)), "the resume starts where iteration 4 ended"
    assert all(after[index] == straight[index] for index in after), \
        "data after the resume at 2 ranks differs from the uninterrupted run"
    per_rank = [len(json.loads(p.read_text())) for p in sorted(
        (tmp_path / "two").glob("trace_rank*.json"))]
    assert per_rank == [4, 4]


def test_tensor_parallel_peers_train_on_what_their_reader_reads(uninterrupted: Path,
                                                                  tmp_path: Path) -> None:
    """TP=2 through pretrain(): only TP rank 0 reads (its peer receives the broadcast), and
    the data is the single rank's, microbatch for microbatch."""
    run = cpu_pretrain(2, tmp_path / "tp", "--train-iters", "3",
                       "--tensor-model-parallel-size", "2")
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "iteration        3/       3" in log
    read = {p.name: len(json.loads(p.read_text())) for p in (tmp_path / "tp").glob("*.json")}
    assert read.get("trace_rank0.json") == 12 and not read.get("trace_rank1.json"), read
    straight, tensor_parallel = digests(uninterrupted / "one"), digests(tmp_path / "tp")
    assert tensor_parallel == {index: straight[index] for index in range(12)}


def test_a_rope_model_trains_on_cpu(tmp_path: Path) -> None:
    """--no-rope-fusion is among the CPU flags: the fused RoPE kernel needs CUDA."""
    run = cpu_pretrain(1, tmp_path / "rope", "--train-iters", "2", "--position-embedding-type",
                       "rope", "--eval-iters", "0")
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "iteration        2/       2" in log


def test_an_early_error_is_printed_once_by_two_ranks(tmp_path: Path) -> None:
    run = cpu_pretrain(2, tmp_path / "bad", "--train-iters", "2", "--global-batch-size", "6")
    assert run.returncode == 2
    assert (run.stdout + run.stderr).count("--global-batch-size 6 is not divisible") == 1


def test_your_own_pretrain_gpt_script_trains_on_what_the_entry_trains_on(
        uninterrupted: Path, tmp_path: Path) -> None:
    """The README's way to keep one's own pretrain_gpt.py (integrations/megatron/examples):
    zephon_pretrain_parts() gives pretrain() its provider and forward step, and the script
    trains on the entry's microbatches."""
    from megatron_helpers import REPO

    script = REPO / "integrations" / "megatron" / "examples" / "own_pretrain_gpt.py"
    command = [sys.executable, "-m", "zephon_megatron_tools.cpu_pretrain", "--nproc", "1",
               "--trace", str(tmp_path / "own"), "--script", str(script), "--timeout", "400",
               "--", *MODEL, *DATA, "--train-iters", "3", "--my-note", "kept"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=450)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "iteration        3/       3" in log
    assert re.search(r"my_note \.+ kept", log), "the script's own flag reaches Megatron"
    straight, own = digests(uninterrupted / "one"), digests(tmp_path / "own")
    assert own == {index: straight[index] for index in range(12)}


def test_zephon_trace_reads_the_loader_state_of_a_torch_dist_checkpoint(
        uninterrupted: Path) -> None:
    """Megatron-LM 0.16's default checkpoint format (torch_dist) holds a .metadata as a
    TorchTitan step folder does; the loader state is still found in its
    train_dataloader_dprank*.pt files."""
    from zephon.recipe import DataRecipe
    from zephon.trace import read_loader_state, trace_steps

    folder = uninterrupted / "ckpt" / "iter_0000004"
    assert (folder / ".metadata").is_file() or (folder / "metadata.json").is_file()
    state = read_loader_state(folder)
    assert sorted(state) == [f"lane_{lane}" for lane in range(8)]
    pipeline = DataRecipe.from_toml(str(PACKED)).build(seq_len=64, microbatch_size=2, lanes=8,
                                                        prefetch=0)
    listed = list(trace_steps(pipeline, 5, 5, 4, 1, state))
    assert [m.global_microbatch for m in listed] == [16, 17, 18, 19]
