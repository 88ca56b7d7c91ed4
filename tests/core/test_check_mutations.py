"""What ``zephon check`` passes builds: random mutations of a valid recipe either fail the check
or build a pipeline that delivers its first batch.

Each mutation changes one key of a valid recipe: drops it, misspells it, or gives it a value of
the wrong type, sign or size. The run values (sequence length, microbatch size, data-parallel
size) are the same for the check and the build, as a framework's preflight passes them. Set
``ZEPHON_MUTATION_SEED`` to explore other mutations than the fixed ones.
"""

from __future__ import annotations

import copy
import os
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_jsonl, write_parquet
from zephon.recipe import DataRecipe
from zephon.recipe.checks import check_recipe

RUN = {"world_size": 1, "seq_len": 32, "microbatch_size": 2}
MUTATIONS = 200
_HUGE = (10**12, 2**63, 10**30)


def base_recipe(tokenizer_dir: str) -> str:
    return f"""
seed = 7
lanes = 2
prefetch = 2
read_ahead_tokens = 4096
workers = 0

[[datasets]]
name = "web"
path = "web"
weight = 0.7

[[datasets]]
name = "wiki"
path = "wiki/*.jsonl"
weight = 0.3
field = "content"

[mixture]
by = "tokens"
repeat = ["wiki"]
on_exhausted = "stop"
primer = "measure"
calibration_samples = 4

[work]
unit_bytes = 4096
shuffle_rows = true

[tokenize]
tokenizer = "{tokenizer_dir}"
max_document_tokens = 512

[pack]
algorithm = "wrap"
max_open_bins = 4

[shuffle]
buffer_size = 8

[batch]
microbatch_size = 2

[to_training]
return_labels = true
eos_mask_loss = true
"""


def _flatten(table: dict[str, Any], prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = []
    for key, value in table.items():
        here = (*prefix, key)
        if isinstance(value, dict):
            paths += [here, *_flatten(value, here)]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            paths.append(here)
            for i, item in enumerate(value):
                paths += _flatten(item, (*here, i))
        else:
            paths.append(here)
    return paths


def _wrong_values(value: Any, rng: random.Random) -> list[Any]:
    """Values of the wrong type, sign or size for ``value``."""
    other_types = ["text", 3, 2.5, True, [1, 2], {"a": 1}]
    candidates = [v for v in other_types if type(v) is not type(value)]
    if isinstance(value, bool):
        return candidates
    if isinstance(value, (int, float)):
        candidates += [-value or -1, 0, -1, value * 10 + 1, rng.choice(_HUGE), 0.5,
                       float("inf"), float("nan")]
    if isinstance(value, str):
        candidates += ["", value + "x", value.upper(), "../nowhere"]
    if isinstance(value, list):
        candidates += [[], value * 3, [None]]
    return candidates


def mutate(recipe: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """One mutation of ``recipe`` and a description of it."""
    mutated = copy.deepcopy(recipe)
    path = rng.choice(_flatten(recipe))
    parent = mutated
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    kind = rng.choice(["drop", "rename", "value", "value", "value"])
    if isinstance(key, int) or kind == "value":
        value = parent[key]
        new = rng.choice(_wrong_values(value, rng))
        parent[key] = new
        return mutated, f"{'.'.join(map(str, path))} = {new!r}"
    if kind == "drop":
        del parent[key]
        return mutated, f"drop {'.'.join(map(str, path))}"
    misspelt = key[:-1] if len(key) > 3 and rng.random() < 0.5 else key + "s"
    parent[misspelt] = parent.pop(key)
    return mutated, f"rename {'.'.join(map(str, path))} -> {misspelt}"


def _toml(table: dict[str, Any]) -> str:
    """A minimal TOML writer for the recipe shapes above (no dependency for a few lines)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(str(v), repr(v))
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v if x is not None) + "]" if None not in v \
                else "[]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return str(v)

    lines = [f"{k} = {value(v)}" for k, v in table.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v
                                                  and isinstance(v[0], dict))]
    for k, v in table.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{a} = {value(b)}" for a, b in v.items()]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                lines.append(f"[[{k}]]")
                lines += [f"{a} = {value(b)}" for a, b in item.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "web" / "a.parquet",
                  [f"web page {i} " + "words " * (i % 13) for i in range(60)])
    write_jsonl(tmp_path / "wiki" / "a.jsonl",
                [{"content": f"wiki article {i} " + "facts " * (i % 7)} for i in range(40)])
    return tmp_path


def _first_batch(path: Path) -> None:
    recipe = DataRecipe.from_toml(path)
    pipeline = recipe.build(seq_len=RUN["seq_len"], microbatch_size=RUN["microbatch_size"],
                            dp_world_size=RUN["world_size"])
    iterator = iter(pipeline)
    try:
        batch = next(iterator)
        batch.to_training(**recipe.training_options())
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def test_the_base_recipe_passes_and_builds(corpus, tokenizer_dir):
    path = corpus / "recipe.toml"
    path.write_text(base_recipe(tokenizer_dir))
    assert check_recipe(path, **RUN) == []
    _first_batch(path)


def test_what_check_passes_delivers_a_first_batch(corpus, tokenizer_dir):
    seed = int(os.environ.get("ZEPHON_MUTATION_SEED", "2026"))
    rng = random.Random(seed)
    base = tomllib.loads(base_recipe(tokenizer_dir))
    failures, passed = [], 0
    for i in range(MUTATIONS):
        mutated, what = mutate(base, rng)
        path = corpus / f"mutant{i}.toml"
        path.write_text(_toml(mutated))
        if check_recipe(path, **RUN):
            continue
        passed += 1
        try:
            _first_batch(path)
        except Exception as exc:
            failures.append(f"{what}: {type(exc).__name__}: {exc}")
    assert not failures, (f"seed {seed}: check passed, then the build or first batch failed:\n"
                          + "\n".join(failures))
    assert 0 < passed < MUTATIONS  # some mutations are harmless, most are caught
