"""The loader's zephon/ metrics reach TorchTitan's TensorBoard event files, per dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zephon_torchtitan_tools.demo import run_training

pytestmark = pytest.mark.slow

LAUNCH = """\
dump_folder = "out"
[base]
module = "llama3"
config = "llama3_debugmodel"
vocab_size = "tokenizer"
[training]
seq_len = 64
steps = 3
[metrics]
log_freq = 1
enable_tensorboard = true
[dataloader]
name = "zephon"
recipe = "data.toml"
"""


def test_zephon_scalars_in_tensorboard(tmp_path: Path, recipes):
    from zephon.demo.assets import make_documents

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.jsonl").write_text("".join(
        json.dumps({"text": t}) + "\n" for t in make_documents(200, seed=8)))
    datasets = recipes.demo() + '\n[[datasets]]\nname = "notes"\npath = "notes"\n'
    data = recipes.write(tmp_path / "data.toml", datasets=datasets)
    data.write_text(data.read_text().replace('by = "documents"', 'by = "documents"\n'
                                             'repeat = true'))
    (tmp_path / "launch.toml").write_text(LAUNCH)
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml")], cwd=tmp_path,
                                   timeout=300)
    assert code == 0, output[-4000:]
    assert "zephon: step 3:" in output and output.count("zephon: end of run (last step)") == 1
    assert output.count("zephon: end of run") == 1
    [events_dir] = {p.parent for p in (tmp_path / "out").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(events_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("demo", "notes"):
        assert f"zephon/realized/{name}" in tags and f"zephon/target/{name}" in tags
    assert {"zephon/wait_ms", "zephon/tokens_per_s", "zephon/padding_share",
            "zephon/loss_share", "zephon/dropped_documents"} <= tags
    shares = [events.Scalars(f"zephon/realized/{n}")[-1].value for n in ("demo", "notes")]
    assert abs(sum(shares) - 1) < 1e-6 and all(0 < s < 1 for s in shares)


def test_a_run_stopped_with_ctrl_c_reports_once(tmp_path: Path, recipes):
    """TorchTitan closes its trainer only on Exception: the report of a run interrupted by
    Ctrl-C comes from the exit hook, once."""
    import os
    import signal
    import subprocess

    from zephon_torchtitan_tools.demo import launch_command

    recipes.write(tmp_path / "data.toml", datasets=recipes.demo())
    (tmp_path / "launch.toml").write_text(LAUNCH.replace("steps = 3", "steps = 100000"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    from tests.conftest import killed_after, sigint_default_in_children

    with sigint_default_in_children():
        proc = subprocess.Popen(launch_command(["--toml", str(tmp_path / "launch.toml")]),
                                cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "2"}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    with killed_after(proc, 300):
        for line in proc.stdout:
            lines.append(line)
            if "zephon: step 3:" in line:
                proc.send_signal(signal.SIGINT)
                break
        lines += proc.stdout.readlines()
        proc.wait(timeout=120)
    output = "".join(lines)
    assert "zephon: step 3:" in output, output[-3000:]
    assert output.count("zephon: end of run") == 1, output[-3000:]
    assert "zephon: end of run (stopped early)" in output


def test_two_ranks_log_the_figures_of_the_job(tmp_path: Path, recipes):
    """At two data-parallel ranks both ranks' console lines give the job's realized shares
    (summed over the ranks: the ranks read different lanes, so shares of their own would
    differ) and agree with TensorBoard. That a job's figures do not depend on its size
    follows from its global microbatches not depending on it (tests/core/test_elastic.py)."""
    import re

    from zephon.demo.assets import make_documents

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.jsonl").write_text("".join(
        json.dumps({"text": t}) + "\n" for t in make_documents(200, seed=8)))
    datasets = recipes.demo() + '\n[[datasets]]\nname = "notes"\npath = "notes"\n'
    data = recipes.write(tmp_path / "data.toml", datasets=datasets, lanes=4)
    data.write_text(data.read_text().replace('by = "documents"', 'by = "documents"\n'
                                             'repeat = true'))
    (tmp_path / "launch.toml").write_text(LAUNCH.replace("steps = 3", "steps = 4").replace(
        "seq_len = 64", "seq_len = 64\nglobal_batch_size = 8\nlocal_batch_size = 2"))
    for nproc in (2,):
        out = tmp_path / f"out{nproc}"
        code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml"),
                                        "--dump_folder", str(out)], nproc=nproc, cwd=tmp_path,
                                       timeout=300)
        assert code == 0, output[-4000:]
        lines = re.findall(r"zephon: step (\d+): .*realized demo ([0-9.]+), notes ([0-9.]+)",
                           output)
        by_step: dict[int, set] = {}
        for step, demo, notes in lines:
            by_step.setdefault(int(step), set()).add((demo, notes))
        assert sorted(by_step) == [1, 2, 3, 4]
        assert all(len(seen) == 1 for seen in by_step.values()), by_step  # ranks agree
        [events_dir] = {p.parent for p in out.rglob("events.out.tfevents.*")}
        events = EventAccumulator(str(events_dir))
        events.Reload()
        board = {e.step: e.value for e in events.Scalars("zephon/realized/demo")}
        assert all(abs(board[s] - float(next(iter(by_step[s]))[0])) < 6e-4 for s in by_step)
