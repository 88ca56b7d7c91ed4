"""Preflight: every problem of a recipe and its data, before a model is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl
from zephon.preflight import check_recipe, peek_field

ROOT = Path(__file__).resolve().parents[2]
DATA_RECIPES = sorted([*ROOT.glob("recipes/torchtitan/data/*.toml"),
                       *ROOT.glob("recipes/megatron/*.toml")])


def zephon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zephon.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.fixture
def two_sources(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "wiki" / "a.jsonl", [{"content": f"wiki text {i}"} for i in range(9)])
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": [f"web {i}" for i in range(9)]}),
                   tmp_path / "web" / "a.parquet")
    pq.write_table(pa.table({"body": [f"web {i}" for i in range(9)]}),
                   tmp_path / "web" / "b.parquet")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"""
lanes = 4
[[datasets]]
name = "wiki"
path = "wiki"
field = "content"
[[datasets]]
name = "web"
path = "web"
[tokenize]
tokenizer = "{tokenizer_dir}"
[pack]
max_length = 65
""")
    return recipe


def test_shipped_data_recipes_pass():
    assert DATA_RECIPES
    for recipe in DATA_RECIPES:
        assert check_recipe(recipe, world_size=1, vocab_size=4096) == [], recipe


def test_a_field_missing_in_one_file_is_named(two_sources):
    [problem] = check_recipe(two_sources)
    assert "dataset 'web'" in problem and "b.parquet: has no field 'text'" in problem
    assert str(two_sources) in problem


def test_run_values_are_checked(two_sources):
    text = two_sources.read_text().replace('path = "web"', 'path = "web/a.parquet"')
    two_sources.write_text(text)
    assert check_recipe(two_sources) == []
    problems = check_recipe(two_sources, world_size=3, seq_len=128, vocab_size=1000,
                            microbatch_size=2)
    assert len(problems) == 3, problems
    assert any("lanes = 4 is not divisible by the data-parallel size 3" in p for p in problems)
    assert any("[pack] max_length = 65 conflicts with the framework's sequence length 128"
               in p for p in problems)
    assert any("has 4096 tokens but the model's vocabulary has 1000" in p for p in problems)


def test_zephon_check_lists_every_problem_and_fails(two_sources):
    text = (two_sources.read_text().replace("lanes = 4", "lanes = 4\n[mixture]\n"
                                            'on_exhausted = "drian"')
            .replace("[pack]", '[shuffle]\nbuffer_size = -1\n[pack]'))
    two_sources.write_text(text.replace('path = "wiki"', 'path = "wikii"'))
    result = zephon("check", str(two_sources), "--world-size", "2")
    assert result.returncode == 1
    assert "3 problem(s)" in result.stderr, result.stderr
    for needle in ("dataset 'wiki'", "wikii", "on_exhausted='drian'", "buffer_size"):
        assert needle in result.stderr
    ok = zephon("check", str(DATA_RECIPES[0]), "--world-size", "4", "--seq-len", "128")
    assert ok.returncode == 0 and ": ok (" in ok.stdout
    usage = zephon("check")
    assert usage.returncode == 2


@pytest.mark.parametrize("rows, kind", [
    ([{"t": "x"}], "text"), ([{"t": [1, 2]}], "list<int>"), ([{"t": [{"role": "user"}]}], "list"),
    ([{"t": None}], "null"), ([{"u": 1}], None), ([], "empty"), ([{"t": 3}], "int"),
])
def test_peek_reads_one_line_of_json_lines(tmp_path, rows, kind):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    assert peek_field(str(path), "jsonl", None, "t") == kind
