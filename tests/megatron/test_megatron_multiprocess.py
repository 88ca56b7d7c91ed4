"""Several processes on gloo: smoke training at 1 and 2 ranks, elastic resume, TP broadcast."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zephon.distributed import launcher_store
from zephon_megatron_tools.smoke import DEFAULT_MEGATRON_FLAGS

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent
SAVE_AT, STEPS, MICROBATCHES_PER_STEP = 6, 12, 4  # the smoke defaults: gbs 8, mbs 2


def smoke(workdir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "zephon_megatron_tools.smoke", "--workdir", str(workdir),
               "--timeout", "240", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def load(workdir: Path, name: str):
    return json.loads((workdir / name).read_text())


def by_global_index(workdir: Path, tag: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for path in sorted(workdir.glob(f"trace_{tag}_rank*.json")):
        for record in json.loads(path.read_text()):
            assert record["global_microbatch"] not in out, "two ranks read one microbatch"
            out[record["global_microbatch"]] = record
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    results = {
        "one": smoke(one, "--nproc", "1", "--tag", "one", "--check-loss"),
        "full": smoke(two, "--nproc", "2", "--tag", "full", "--save-at", str(SAVE_AT),
                      "--check-loss", "--", *DEFAULT_MEGATRON_FLAGS, "--zephon-trace-dir",
                      str(two / "adapter-trace")),
    }
    results["resumed"] = smoke(two, "--nproc", "1", "--tag", "resumed", "--resume")
    for tag, result in results.items():
        assert result.returncode == 0, f"{tag}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return {"one": one, "two": two}


@pytest.mark.parametrize("where,tag,dp", [("one", "one", 1), ("two", "full", 2)])
def test_smoke_trains_and_the_loss_falls(runs, where: str, tag: str, dp: int) -> None:
    summary = load(runs[where], f"summary_{tag}.json")
    losses = summary["losses"]
    assert summary["dp_size"] == dp and len(losses) == STEPS >= 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3


def test_global_batches_do_not_depend_on_the_process_count(runs) -> None:
    one, two = by_global_index(runs["one"], "one"), by_global_index(runs["two"], "full")
    assert sorted(one) == sorted(two) == list(range(STEPS * MICROBATCHES_PER_STEP))
    assert all(one[g]["digest"] == two[g]["digest"] for g in one)


def test_resume_at_one_process_continues_the_two_process_run(runs) -> None:
    full = by_global_index(runs["two"], "full")
    resumed = by_global_index(runs["two"], "resumed")
    first = SAVE_AT * MICROBATCHES_PER_STEP
    assert sorted(resumed) == list(range(first, STEPS * MICROBATCHES_PER_STEP))
    for index, record in resumed.items():
        assert record["tokens"] == full[index]["tokens"], f"microbatch {index}"
        assert record["digest"] == full[index]["digest"], f"microbatch {index}"
    states = sorted((runs["two"] / "dataloader" / f"iter_{SAVE_AT:07d}").rglob("*.pt"))
    assert [p.name for p in states] == ["train_dataloader_dprank000.pt",
                                        "train_dataloader_dprank001.pt"]
    losses_full = load(runs["two"], "summary_full.json")["losses"][SAVE_AT:]
    losses_resumed = load(runs["two"], "summary_resumed.json")["losses"]
    assert losses_resumed == pytest.approx(losses_full, rel=1e-3)


def test_zephon_trace_lists_what_the_ranks_trained_on(runs) -> None:
    """--zephon-trace-dir records each training microbatch; ``zephon trace`` from the loader
    state saved at step 6 of the two-rank run lists the same record ids for steps 7 and 8."""
    from zephon_megatron_tools.smoke import RECIPE

    two = runs["two"]
    recorded = {}
    for path in (two / "adapter-trace").glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            recorded[record["global_microbatch"]] = record
    assert sorted(recorded) == list(range(STEPS * MICROBATCHES_PER_STEP))
    run = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "trace", str(RECIPE), "--steps",
         f"{SAVE_AT + 1}:{SAVE_AT + 2}", "--world-size", "2", "--global-batch-size", "8",
         "--microbatch-size", "2", "--seq-len", "64", "--from-state",
         str(two / "dataloader" / f"iter_{SAVE_AT:07d}"), "--json"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    listed = [json.loads(line) for line in run.stdout.splitlines()]
    first = SAVE_AT * MICROBATCHES_PER_STEP
    assert [m["global_microbatch"] for m in listed] == list(range(first, first + 8))
    for microbatch in listed:
        trained = recorded[microbatch["global_microbatch"]]
        assert (microbatch["ids"], microbatch["dp_rank"]) == (trained["ids"], trained["dp_rank"])


def test_tensor_parallel_ranks_receive_the_readers_batch(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    _store, rendezvous = launcher_store(2)  # held until the ranks exit
    env = {**os.environ, **rendezvous, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(HERE / "tp_broadcast_worker.py"), str(out)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=240) for p in ranks]
    assert all(p.returncode == 0 for p in ranks), outputs
    reader, receiver = json.loads(out.read_text())
    assert reader["reader"] and not receiver["reader"]
    assert receiver["report"] == reader["report"]
    thd, dense = reader["report"]["thd"], reader["report"]["dense"]
    assert len({b["cu_len"] for b in thd}) > 1, "cu_seqlens length varies between batches"
    assert all(b["packed"][2] == "thd" and b["attention_mask"] == "none" for b in thd)
    assert all(b["packed"] is None and b["attention_mask"] != "none" for b in dense)


@pytest.mark.multiprocess
def test_a_data_path_blend_trains(tmp_path: Path) -> None:
    """The Megatron way to switch loaders: Megatron's --data-path blend plus --dataloader
    zephon, over indexed datasets (what make smoke-megatron runs third)."""
    written = smoke(tmp_path, "--write-indexed-demo", str(tmp_path / "data"))
    assert written.returncode == 0, written.stderr[-2000:]
    web, code = (str(tmp_path / "data" / f"{n}_text_document") for n in ("web", "code"))
    result = smoke(tmp_path / "run", "--nproc", "2", "--tag", "blend", "--check-loss", "--",
                   "--data-path", "0.7", web, "0.3", code, "--split", "98,2,0",
                   "--dataloader", "zephon", "--zephon-lanes", "8", "--vocab-size", "4096",
                   "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
                   "--reset-position-ids", "--reset-attention-mask",
                   "--calculate-per-token-loss", "--transformer-impl", "local",
                   "--train-iters", "12", "--eval-iters", "0", "--eval-interval", "12")
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "loss" in result.stdout


def two_source_recipe(tmp_path: Path) -> Path:
    """The packed recipe plus a repeated "notes" dataset whose text is in ``content``."""
    from megatron_helpers import PACKED

    from zephon.demo.assets import make_documents

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.jsonl").write_text("".join(
        json.dumps({"content": t}) + "\n" for t in make_documents(300, seed=5)))
    recipe = tmp_path / "two.toml"
    recipe.write_text(PACKED.read_text().replace(
        '\n[mixture]\n', f'\n[[datasets]]\nname = "notes"\npath = "{tmp_path / "notes"}"\n'
        'field = "content"\n\n[mixture]\n').replace('repeat = ["demo"]', "repeat = true"))
    return recipe


@pytest.mark.multiprocess
def test_two_sources_with_different_fields_train(tmp_path: Path) -> None:
    from megatron_helpers import megatron_argv

    recipe = two_source_recipe(tmp_path)
    result = smoke(tmp_path / "run", "--nproc", "1", "--tag", "two", "--check-loss", "--",
                   *megatron_argv(recipe), "--train-iters", "12", "--eval-interval", "12")
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


@pytest.mark.multiprocess
def test_loader_metrics_reach_the_tensorboard_writer(tmp_path: Path) -> None:
    from megatron_helpers import PACKED, megatron_argv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    result = smoke(tmp_path / "run", "--nproc", "1", "--tag", "tb", "--",
                   *megatron_argv(PACKED), "--train-iters", "4", "--eval-interval", "4",
                   "--log-interval", "2", "--tensorboard-dir", str(board))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "zephon: step 2:" in result.stdout
    assert result.stdout.count("zephon: end of run (") == 1 and "realized" in result.stdout
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"zephon/realized/demo", "zephon/target/demo", "zephon/padding_share",
            "zephon/tokens_per_s", "zephon/wait_ms"} <= tags
    assert [e.step for e in events.Scalars("zephon/realized/demo")] == [2, 4]


@pytest.mark.multiprocess
def test_logged_loader_figures_describe_the_job(tmp_path: Path) -> None:
    """Two data-parallel ranks log the realized shares one rank logs for the same data, and
    the console line (data-parallel rank 0) agrees with TensorBoard (the last rank); the
    end-of-run report is the job's, the same at one and at two ranks."""

    from megatron_helpers import megatron_argv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recipe = two_source_recipe(tmp_path)
    logged = {}
    reports = {}
    for nproc in (1, 2):
        board = tmp_path / f"tb{nproc}"
        result = smoke(tmp_path / f"run{nproc}", "--nproc", str(nproc), "--tag", f"w{nproc}",
                       "--", *megatron_argv(recipe), "--zephon-lanes", "4", "--train-iters",
                       "6", "--eval-interval", "6", "--log-interval", "2", "--tensorboard-dir",
                       str(board))
        assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        reports[nproc] = end_of_run_report(result.stdout)
        events = EventAccumulator(str(board))
        events.Reload()
        logged[nproc] = {name: [(e.step, e.value) for e in events.Scalars(f"zephon/{name}")]
                         for name in ("realized/demo", "realized/notes", "padding_share",
                                      "dropped_documents")}
        console = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
            r"zephon: step (\d+):.*realized demo ([0-9.]+)", result.stdout)}
        board_demo = dict(logged[nproc]["realized/demo"])
        assert sorted(console) == sorted(board_demo) == [2, 4, 6]
        assert all(abs(console[s] - board_demo[s]) < 6e-4 for s in console)
    for name in ("realized/demo", "realized/notes", "padding_share"):
        one, two = logged[1][name], logged[2][name]
        assert [s for s, _ in one] == [s for s, _ in two]
        assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(one, two, strict=True)), (
            name, one, two)
    assert 0 < logged[2]["realized/notes"][-1][1] < 1
    # the end-of-run report covers the job at any number of processes, as one process sees it
    assert reports[2] == reports[1]
    header, table = reports[2]
    assert "24 microbatches, 48 rows of 65 tokens = 3,120 tokens" in header
    handed = sum(int(row.split()[2].replace(",", "")) for row in table
                 if row.split()[0] in ("demo", "notes"))
    padding = int(re.search(r"padding tokens ([0-9,]+)", "\n".join(table)).group(1)
                  .replace(",", ""))
    assert handed + padding == 3120, "the header's tokens are the table's"


def end_of_run_report(stdout: str) -> tuple[str, list[str]]:
    """(the header without the loader's timing, the table) of the one end-of-run report."""
    lines = stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("zephon: end of run ("))
    assert sum(line.startswith("zephon: end of run (") for line in lines) == 1
    table = []
    for line in lines[first + 1:]:
        table.append(line)
        if line.startswith("microbatches "):
            break
    assert not any("this rank's lanes only" in line for line in table), table
    return lines[first].split(", loader ")[0], table


@pytest.mark.multiprocess
def test_a_run_stopped_with_ctrl_c_reports_once(tmp_path: Path) -> None:
    import signal

    from megatron_helpers import PACKED, megatron_argv

    command = [sys.executable, "-m", "zephon_megatron_tools.smoke", "--workdir", str(tmp_path),
               "--nproc", "1", "--timeout", "240", "--", *megatron_argv(PACKED),
               "--train-iters", "100000", "--eval-interval", "100000", "--log-interval", "1"]
    from tests.conftest import killed_after, sigint_default_in_children

    with sigint_default_in_children():
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    lines = []
    try:
        with killed_after(proc, 300, kill_group):
            for line in proc.stdout:
                lines.append(line)
                if "zephon: step 3:" in line:
                    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole group
                    break
            lines += proc.stdout.readlines()
            proc.wait(timeout=120)
    finally:
        kill_group()
    output = "".join(lines)
    assert "zephon: step 3:" in output, output[-3000:]
    assert output.count("zephon: end of run") == 1, output[-3000:]
    assert "zephon: end of run (at exit)" in output
