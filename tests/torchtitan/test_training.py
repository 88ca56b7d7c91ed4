"""Real TorchTitan trainings on CPU (llama3 debug model, gloo), through every selection route.

Each training runs in child processes started the way a user starts them. The two-process
run is shared by the smoke, elastic-resume and same-size-resume tests.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from zephon_torchtitan_tools.demo import run_training

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "torchtitan" / "smoke.toml"
# Rows of 64 tokens keep the CPU time down (the smoke recipe itself uses 128).
SHORT = ["--training.seq_len", "64"]
# 10 steps of 8 rows across the data-parallel ranks; checkpoint at step 5.
RESUMABLE = [*SHORT, "--training.steps", "10", "--training.global_batch_size", "8",
             "--checkpoint.enable", "--checkpoint.interval", "5", "--validator.no-enable"]

pytestmark = pytest.mark.slow


def train(args: list[str], tmp: Path, nproc: int = 1, **kwargs) -> tuple[str, dict]:
    code, output, losses = run_training(args, nproc=nproc, cwd=tmp, **kwargs)
    assert code == 0, output[-6000:]
    return output, losses


def traces(directory: Path) -> dict[int, dict]:
    """Global microbatch index -> trace line, over all ranks' files."""
    lines = {}
    for path in directory.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            lines[record["global_microbatch"]] = record
    return lines


def falls(losses: dict[int, float], steps: int) -> bool:
    return sorted(losses) == list(range(1, steps + 1)) and losses[steps] < losses[1] - 0.5


def test_toml_route_one_process(tmp_path):
    output, losses = train(["--toml", str(SMOKE), *SHORT, "--training.steps", "10",
                            "--validator.freq", "5", "--dump_folder", str(tmp_path / "out")],
                           tmp_path)
    assert falls(losses, 10), losses
    assert "validate step" in output
    assert "zephon: 6 microbatches" in output and "padding" in output


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two")
    output, losses = train(["--toml", str(SMOKE), *RESUMABLE, "--dump_folder", str(tmp / "out"),
                            "--dataloader.trace_dir", str(tmp / "trace")], tmp, nproc=2)
    return tmp, output, losses


def resume(run_dir: Path, tmp: Path, nproc: int) -> tuple[dict[int, float], dict[int, dict]]:
    checkpoint = tmp / "out" / "checkpoint"
    checkpoint.mkdir(parents=True)
    shutil.copytree(run_dir / "out" / "checkpoint" / "step-5", checkpoint / "step-5")
    output, losses = train(["--toml", str(SMOKE), *RESUMABLE, "--dump_folder", str(tmp / "out"),
                            "--dataloader.trace_dir", str(tmp / "trace")], tmp, nproc=nproc)
    assert "Loading the checkpoint from" in output and "zephon: resumed" in output
    return losses, traces(tmp / "trace")


@pytest.mark.multiprocess
def test_two_processes_train_and_loss_falls(two_process_run):
    tmp, output, losses = two_process_run
    assert falls(losses, 10), losses
    assert output.count("zephon: end of run") == 1  # rank 0 only, once
    seen = traces(tmp / "trace")
    assert sorted(seen) == list(range(20))
    assert {seen[m]["dp_rank"] for m in seen} == {0, 1}


@pytest.mark.multiprocess
def test_elastic_resume_two_to_one_process_gives_the_same_batches(two_process_run, tmp_path):
    run_dir, _, _ = two_process_run
    reference = traces(run_dir / "trace")
    losses, resumed = resume(run_dir, tmp_path, nproc=1)
    assert sorted(losses) == list(range(6, 11))
    assert sorted(resumed) == list(range(10, 20))  # steps 6..10, two microbatches each
    for m, line in resumed.items():
        assert line["dp_world_size"] == 1
        assert line["sha256"] == reference[m]["sha256"], f"global microbatch {m} differs"
        assert line["ids"] == reference[m]["ids"]


@pytest.mark.multiprocess
def test_resume_at_the_same_size_gives_identical_losses(two_process_run, tmp_path):
    run_dir, _, reference_losses = two_process_run
    losses, resumed = resume(run_dir, tmp_path, nproc=2)
    assert losses == {s: reference_losses[s] for s in range(6, 11)}
    reference = traces(run_dir / "trace")
    assert {m: r["sha256"] for m, r in resumed.items()} == {
        m: reference[m]["sha256"] for m in range(10, 20)}


def test_override_route_on_a_stock_config(tmp_path, small_tokenizer, recipes):
    recipe = recipes.write(tmp_path / "data.toml", datasets=recipes.demo(), lanes=2,
                           tokenizer=small_tokenizer)
    target = "zephon_torchtitan.override.zephon_dataloader=" + json.dumps({"recipe": str(recipe)})
    output, losses = train(["-m", "torchtitan.train", "--module", "llama3",
                            "--config", "llama3_debugmodel",
                            "--override.imports", target, "--hf_assets_path", small_tokenizer,
                            *SHORT, "--training.local_batch_size", "2",
                            "--training.steps", "2", "--training.disable_cuda_graphs",
                            "--parallelism.spmd_backend", "partial_dtensor",
                            "--validator.no-enable", "--dump_folder", str(tmp_path / "out")],
                           tmp_path, module="zephon_torchtitan_tools.cpu_shims", torchrun=True)
    assert sorted(losses) == [1, 2]
    assert "[Override] zephon_torchtitan.override.zephon_dataloader" in output
    assert "zephon: recipe" in output


@pytest.mark.multiprocess
def test_zephon_trace_lists_what_the_ranks_trained_on(two_process_run):
    """``zephon trace`` from the step-5 checkpoint of the two-rank run, read by one process,
    lists for steps 6 and 7 the record ids the loader's trace wrote while training."""
    import subprocess
    import sys

    tmp, _, _ = two_process_run
    data = SMOKE.parent / "data" / "pretrain_docmask.toml"
    run = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "trace", str(data), "--steps", "6:7",
         "--world-size", "2", "--global-batch-size", "8", "--microbatch-size", "4",
         "--seq-len", "64", "--from-state", str(tmp / "out" / "checkpoint" / "step-5"),
         "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    listed = [json.loads(line) for line in run.stdout.splitlines()]
    recorded = traces(tmp / "trace")
    assert [m["global_microbatch"] for m in listed] == [10, 11, 12, 13]
    for microbatch in listed:
        trained = recorded[microbatch["global_microbatch"]]
        assert microbatch["ids"] == trained["ids"]
        assert microbatch["dp_rank"] == trained["dp_rank"]
        assert all(d["file"].endswith(".parquet") and d["excerpt"]
                   for row in microbatch["rows"] for d in row)
    # The checkpoint tells the rest: its state's ranks, rows and lengths, and its step.
    alone = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "trace", str(data), "--steps", "6:7",
         "--from-state", str(tmp / "out" / "checkpoint" / "step-5"), "--json"],
        capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert [json.loads(line) for line in alone.stdout.splitlines()] == listed
    # The run's folder tells everything: the recipe, the sizes and the checkpoint to start at.
    timed = time.perf_counter()
    from_run = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "trace", str(tmp / "out"), "--steps", "6:7",
         "--json"], capture_output=True, text=True, timeout=300)
    print(f"zephon trace RUN_DIR for two steps: {time.perf_counter() - timed:.1f} s")
    assert from_run.returncode == 0, from_run.stderr[-3000:]
    assert [json.loads(line) for line in from_run.stdout.splitlines()] == listed
    # before the first checkpoint it replays from the start, still matching what trained
    early = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "trace", str(tmp / "out"), "--steps", "2",
         "--json"], capture_output=True, text=True, timeout=300)
    assert early.returncode == 0, early.stderr[-3000:]
    assert [(m["global_microbatch"], m["ids"]) for m in map(json.loads, early.stdout.split(
        "\n")[:-1])] == [(g, recorded[g]["ids"]) for g in (2, 3)]
