"""Megatron-LM's pretrain() on CPU with Megatron's own --data-path: a blend run saved at 2
processes resumes at 1 and at 2, microbatch for microbatch, with a Hugging Face tokenizer and
with NullTokenizer (the model's padded vocabulary is part of the loader's fingerprint: the
preflight and the provider must derive it alike).

Needs what ``pretrain()`` imports (see test_megatron_pretrain.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron_helpers import NEEDS_PRETRAIN, cpu_pretrain, digests

pytestmark = [pytest.mark.multiprocess, NEEDS_PRETRAIN]

MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
         "--seq-length", "64", "--max-position-embeddings", "64", "--lr", "3e-3",
         "--seed", "1234", "--log-interval", "1"]
SAVED_AT, ITERATIONS, PER_STEP = 4, 6, 4  # global batch 8 of micro batches of 2


def blend_flags(data: Path, tokenizer: str) -> list[str]:
    from zephon.demo.assets import build_demo_assets

    web, code = (str(data / f"{name}_text_document") for name in ("web", "code"))
    if tokenizer == "hf":  # the tokenizer the data was written with: its EOD masks the loss
        chosen = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                  str(build_demo_assets()["tokenizer"]), "--eod-mask-loss"]
    else:
        chosen = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"]
    return ["--micro-batch-size", "2", "--global-batch-size", "8", "--calculate-per-token-loss",
            "--reset-position-ids", "--reset-attention-mask", "--dataloader", "zephon",
            "--data-path", "0.7", web, "0.3", code, "--split", "98,2,0", "--eval-interval",
            "100", "--eval-iters", "0", "--train-iters", str(ITERATIONS), *chosen]


@pytest.fixture(scope="module", params=["hf", "null"])
def saved(request, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two processes, 6 iterations, checkpoints at 4 and 6 (the latest)."""
    from zephon_megatron_tools.smoke import write_indexed_demo

    tmp = tmp_path_factory.mktemp(f"blend-{request.param}")
    write_indexed_demo(str(tmp / "data"))
    flags = blend_flags(tmp / "data", request.param)
    run = cpu_pretrain(2, tmp / "two", *MODEL, *flags, "--save", str(tmp / "ckpt"),
                       "--save-interval", str(SAVED_AT), "--zephon-trace-dir",
                       str(tmp / "adapter-trace"))
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert (tmp / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    return {"flags": flags, "ckpt": tmp / "ckpt", "trace": tmp / "two", "log": log,
            "tokenizer": request.param, "recorded": tmp / "adapter-trace"}


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_data_path_run_resumes_exactly_at_one_and_two_processes(saved: dict, nproc: int,
                                                                   tmp_path: Path) -> None:
    resumed = cpu_pretrain(nproc, tmp_path / "resumed", *MODEL, *saved["flags"], "--load",
                           str(saved["ckpt"]), "--ckpt-step", str(SAVED_AT))
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert f"iteration        {SAVED_AT + 1}/       {ITERATIONS}" in log

    straight, after = digests(saved["trace"]), digests(tmp_path / "resumed")
    assert sorted(straight) == list(range(ITERATIONS * PER_STEP))
    assert sorted(after) == list(range(SAVED_AT * PER_STEP, ITERATIONS * PER_STEP)), \
        "the resume starts where iteration 4 ended"
    assert all(after[index] == straight[index] for index in after), \
        f"{saved['tokenizer']}: the resume at {nproc} differs from the uninterrupted run"


def recorded_microbatches(directory: Path) -> dict[int, dict]:
    """What each reader recorded with --zephon-trace-dir, by global microbatch."""
    out = {}
    for path in directory.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out[record["global_microbatch"]] = record
    return out


def test_the_end_of_run_report_is_the_jobs(saved: dict) -> None:
    log = saved["log"]
    assert log.count("zephon: end of run (") == 1
    assert "zephon: end of run (end of training): 24 microbatches, 48 rows of 65 tokens" in log
    assert "this rank's lanes only" not in log


def test_trace_lists_what_the_readers_trained_on_from_the_runs_own_flags(saved: dict) -> None:
    """python -m zephon_megatron_tools.trace reads the blend from --data-path, the loader state
    from the torch_dist checkpoint at --ckpt-step 4 (the latest is 6), and lists iterations 5
    and 6 as the two readers recorded them."""
    from zephon_megatron_tools.trace import trace_run

    recorded = recorded_microbatches(saved["recorded"])
    assert sorted(recorded) == list(range(ITERATIONS * PER_STEP))
    flags = [*MODEL, *saved["flags"], "--load", str(saved["ckpt"]), "--ckpt-step",
             str(SAVED_AT)]
    listed = list(trace_run(flags, SAVED_AT + 1, ITERATIONS, world_size=2))
    assert [m.global_microbatch for m in listed] == list(range(16, 24))
    assert [m.step for m in listed] == [5] * 4 + [6] * 4
    for traced in listed:
        trained = recorded[traced.global_microbatch]
        assert (traced.ids, traced.dp_rank) == (trained["ids"], trained["dp_rank"])
    assert all(d.dataset in ("web_text_document", "code_text_document")
               for m in listed for row in m.rows for d in row)
    from_start = list(trace_run([*MODEL, *saved["flags"]], 1, 1, world_size=2))  # replayed
    assert [m.ids for m in from_start] == [recorded[g]["ids"] for g in range(4)]
    folder = list(trace_run([*MODEL, *saved["flags"]], 6, 6, world_size=1,
                            from_state=str(saved["ckpt"] / "iter_0000004")))
    assert [m.ids for m in folder] == [recorded[g]["ids"] for g in range(20, 24)]
    assert [m.dp_rank for m in folder] == [0, 0, 0, 0]  # one rank would train on all


def test_the_trace_tool_takes_the_runs_folder(saved: dict, capsys) -> None:
    """The run wrote its record into --save: ``--run SAVE_DIR`` needs no flags, sizes or
    state typed again, and starts from the newest checkpoint before the iteration asked
    for; ``zephon trace`` names the tool for a Megatron run."""
    from zephon.integration import RunRecord
    from zephon_megatron_tools.trace import main

    if saved["tokenizer"] != "hf":
        pytest.skip("the record is the same for both tokenizers: one run of the tool is enough")
    record = RunRecord.read(saved["ckpt"])
    assert (record.framework, record.dp_size, record.microbatch_size, record.seq_len,
            record.microbatches_per_step, record.recipe) == ("megatron", 2, 2, 64, 4, None)
    assert "--data-path" in record.flags
    recorded = recorded_microbatches(saved["recorded"])
    for steps, first in ((f"{SAVED_AT + 1}:{ITERATIONS}", 16), ("2", 4)):
        assert main(["--run", str(saved["ckpt"]), "--steps", steps, "--json"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [m["global_microbatch"] for m in listed] == list(range(first, first + len(
            listed))) and listed
        assert all((m["ids"], m["dp_rank"]) == (recorded[m["global_microbatch"]]["ids"],
                                                recorded[m["global_microbatch"]]["dp_rank"])
                   for m in listed)
    from zephon.cli import main as zephon

    with pytest.raises(SystemExit):
        zephon(["trace", str(saved["ckpt"]), "--steps", "5"])
    assert "zephon_megatron_tools.trace --run" in capsys.readouterr().err
