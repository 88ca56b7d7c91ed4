"""The TorchTitan README's commands train as written (three routes, two steps each), and each
reads its data recipe and lists each dataset once per process (they were read 4-7 times: the
config, the preflight, the vocabulary and the loader)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_torchtitan_tools.demo import parse_losses

REPO = Path(__file__).resolve().parents[2]
README = REPO / "integrations" / "torchtitan" / "README.md"
COMMANDS = re.findall(r"```bash readme-test\n(.*?)\n```", README.read_text(), re.S)

RECIPES = (2, 2, 1)
"""Recipes each command's trainer reads (the smoke recipe and the registry's config name a
validation recipe too, read though the validator is off)."""

pytestmark = pytest.mark.slow


def test_the_readme_shows_three_routes():
    assert len(COMMANDS) == 3
    assert "zephon_torchtitan.train --toml" in COMMANDS[0]
    assert "--module zephon_torchtitan" in COMMANDS[1]
    assert "--override.imports" in COMMANDS[2]


@pytest.mark.parametrize("command, recipes", list(zip(COMMANDS, RECIPES, strict=True)),
                         ids=["launcher", "registry", "override"])
def test_readme_command_trains(command, recipes, tmp_path, read_counts):
    argv = shlex.split(command)
    assert argv[0] == "python"
    argv[0] = sys.executable  # the interpreter of this environment, as `python` would be
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert sorted(parse_losses(output)) == [1, 2], output[-3000:]
    assert "zephon: preflight passed" in output
    assert "zephon: recipe" in output and "pretrain_docmask.toml" in output
    counts = read_counts()
    assert counts, "no process counted anything"
    for pid, lines in counts.items():
        assert all(n == 1 for n in lines.values()), (pid, lines)
    assert any(sum(1 for line in lines if line.startswith("recipe ")) == recipes
               for lines in counts.values()), counts
