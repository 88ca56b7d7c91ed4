"""The guide's example files and the demo run as written (local corpus and tokenizer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "guide" / "pipelines").glob("*.py"))


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {**os.environ, "ZEPHON_DEMO_HOME": str(tmp_path_factory.mktemp("demo-home"))}


def run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, env):
    lines = run([str(path)], env).splitlines()
    assert lines
    if path.name == "batch_operator.py":
        assert all(line.startswith("32 [") for line in lines)  # drop_last: no short batch
    if path.name == "non_token_batch.py":
        assert lines == ["(32, 8, 8) (32,)"] * 8
    if path.name == "to_training_integrations.py":
        assert "'tokens': (4, 256)" in lines[1] and "'input_ids': (1024,)" in lines[0]


def test_demo_explains_a_row(env):
    out = run(["-m", "zephon.demo"], env)
    assert "First batch after" in out
    assert "<- new document" in out
    assert "tokens/s" in out
    assert "realized" in out
