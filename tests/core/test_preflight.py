"""Preflight: every problem of a recipe and its data, before a model is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl
from zephon.recipe.checks import check_recipe, peek_field

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
    assert "its fields: 'body'" in problem and "field = <one of them>" in problem
    two_sources.write_text(two_sources.read_text().replace('field = "content"\n', ""))
    problems = check_recipe(two_sources)
    assert any("a.jsonl: has no field 'text'" in p and "its fields: 'content'" in p
               for p in problems), problems
    assert str(two_sources) in problem


def test_run_values_are_checked(two_sources):
    text = two_sources.read_text().replace('path = "web"', 'path = "web/a.parquet"')
    two_sources.write_text(text)
    assert check_recipe(two_sources) == []
    problems = check_recipe(two_sources, world_size=3, seq_len=128, vocab_size=1000,
                            microbatch_size=2)
    assert len(problems) == 3, problems
    assert any("lanes = 4: 4 lanes cannot be shared by 3 data-parallel readers" in p
               for p in problems)
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


def test_an_unknown_key_hides_no_other_problem(two_sources):
    text = two_sources.read_text()
    two_sources.write_text("colour = 'blue'\n" + text.replace('path = "wiki"', 'path = "nowiki"')
                           .replace('name = "web"', 'name = "web"\nweight = -1.0'))
    problems = check_recipe(two_sources)
    assert len(problems) == 3, problems
    assert any("unknown key(s) ['colour']" in p for p in problems)
    assert any("dataset 'wiki'" in p and "nowiki" in p for p in problems)
    assert any("weight of 'web'" in p and "-1.0" in p for p in problems)


@pytest.mark.parametrize(("edit", "named"), [
    ("seed = -3", "seed must be an integer in [0, 2**64), got -3"),
    ("[work]\nunit_bytes = 0", "[work] unit_bytes must be a positive integer, got 0"),
    ("[batch]\nmicrobatch_size = 4000000000", "microbatch_size = 4000000000 is more than"),
    ("prefetch = -1", "prefetch must be an integer >= 0"),
    ("workers = 9223372036854775808", "workers = 9223372036854775808 is more than"),
    ("lanes = 1000000000000", "lanes = 1000000000000 is more than"),
])
def test_values_that_would_fail_the_build_fail_the_check(two_sources, edit, named):
    text = two_sources.read_text().replace("lanes = 4\n", "")
    if edit.startswith("["):
        text += edit + "\n"
    else:
        text = edit + "\n" + text
    two_sources.write_text(text.replace("b.parquet", "a.parquet"))
    problems = [p for p in check_recipe(two_sources) if "has no field" not in p]
    assert len(problems) == 1 and named in problems[0], problems


def test_a_row_that_would_need_terabytes_fails_the_check(two_sources):
    text = two_sources.read_text()
    two_sources.write_text(text.replace("max_length = 65", "max_length = 4000000000000"))
    [problem, *_] = check_recipe(two_sources)
    assert "max_length = 4000000000000 is more than 16777216 tokens" in problem
    two_sources.write_text(text.replace("max_length = 65\n", ""))
    problems = check_recipe(two_sources, seq_len=8_000_000, microbatch_size=512)
    assert any("a microbatch of 512 rows x 8000001 tokens" in p for p in problems), problems
    problems = check_recipe(two_sources, seq_len=20_000_000)
    assert any("rows of 20000001 tokens" in p for p in problems), problems


def test_two_datasets_of_one_name_fail_the_check(two_sources):
    two_sources.write_text(two_sources.read_text().replace('name = "wiki"', 'name = "web"'))
    problems = check_recipe(two_sources)
    assert any("names must be unique; repeated: ['web']" in p for p in problems), problems
