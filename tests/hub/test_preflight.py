"""The preflight resolves Hub datasets (commit pinned) and names the ones that do not."""

from __future__ import annotations

from tests.hub.hubdata import docs, sharded
from zephon.recipe import DataRecipe
from zephon.recipe.checks import check_recipe


def recipe_for(tmp_path, tokenizer_dir, *paths, cache=True):
    data = {"datasets": [{"name": f"d{i}", "path": p} for i, p in enumerate(paths)],
            "tokenize": {"tokenizer": tokenizer_dir}}
    if cache:
        data["cache"] = {"root": str(tmp_path / "cache")}
    return DataRecipe.from_dict(data, source="hub.toml")


def test_hub_datasets_resolve_or_are_named(hub, tmp_path, tokenizer_dir):
    hub.create("org/there", sharded(docs(20, seed=1), 2, "data/train-{i:05d}-of-{n:05d}"
                                                         ".parquet"))
    good = recipe_for(tmp_path, tokenizer_dir, "hf://org/there/train")
    assert check_recipe(good) == []
    bad = recipe_for(tmp_path, tokenizer_dir, "hf://org/there/train", "hf://org/gone/train")
    [problem] = check_recipe(bad)
    assert problem.startswith("hub.toml: dataset 'd1' (hf://org/gone/train)")
    uncached = recipe_for(tmp_path, tokenizer_dir, "hf://org/there/train", cache=False)
    [problem] = check_recipe(uncached)
    assert "need a [cache] section" in problem
