"""Recipes with ``s3://`` paths: kept as written, checked by listing and peeking the
objects (footers and first lines, no downloads), and read like local data; ``zephon cache``
lists and verifies the objects in the cache."""

from __future__ import annotations

from tests.hub.hubdata import docs, jsonl_bytes, sharded
from tests.kit.object_stores import upload
from zephon.recipe import DataRecipe
from zephon.recipe.checks import check_recipe


def recipe_for(tmp_path, tokenizer_dir, *paths, cache=True, field=None):
    data = {"datasets": [{"name": f"d{i}", "path": p} for i, p in enumerate(paths)],
            "tokenize": {"tokenizer": tokenizer_dir, **({"field": field} if field else {})}}
    if cache:
        data["cache"] = {"root": str(tmp_path / "cache")}
    return DataRecipe.from_dict(data, source="s3.toml", base_dir=tmp_path)


def test_s3_paths_are_kept_listed_and_peeked_without_downloads(s3, proxy, tmp_path,
                                                               tokenizer_dir):
    objects = sharded(docs(40, seed=1), 2, "web/{i}.parquet")
    objects["chat/0.jsonl"] = jsonl_bytes([{"body": t} for t in docs(5, seed=2)])
    s3.bucket("recipes", objects)
    good = recipe_for(tmp_path, tokenizer_dir, "s3://recipes/web/*.parquet")
    assert good.datasets[0].path == "s3://recipes/web/*.parquet"
    assert check_recipe(good) == []
    problems = check_recipe(recipe_for(tmp_path, tokenizer_dir, "s3://recipes/web/",
                                       "s3://recipes/chat/", field="body"))
    assert len(problems) == 2, problems
    assert problems[0].startswith("s3.toml: dataset 'd0': s3://recipes/web/0.parquet: has no "
                                  "field 'body'")
    assert "its fields: 'text', 'id'" in problems[0]
    [missing] = check_recipe(recipe_for(tmp_path, tokenizer_dir, "s3://recipes/nothing/*"))
    assert missing.startswith("s3.toml: dataset 'd0' (s3://recipes/nothing/*): ")
    assert "no objects match" in missing
    [uncached] = check_recipe(recipe_for(tmp_path, tokenizer_dir, "s3://recipes/web/",
                                         cache=False))
    assert "need a [cache] section" in uncached
    # only listings and footer ranges: nothing was downloaded
    assert not any((tmp_path / "cache" / "shards").iterdir())


def test_a_recipe_reads_s3_as_it_reads_the_same_files_locally(s3, two_datasets, tmp_path,
                                                              tokenizer_dir):
    upload(s3, "recipe-corpus", two_datasets["short"].parent)
    texts = {}
    for where, paths in (("local", [str(two_datasets["short"]), str(two_datasets["long"])]),
                         ("s3", ["s3://recipe-corpus/short/", "s3://recipe-corpus/long/"])):
        data = {"datasets": [{"name": n, "path": p} for n, p in zip(["short", "long"], paths,
                                                                      strict=True)],
                "tokenize": {"tokenizer": tokenizer_dir}, "pack": {"max_length": 64},
                "batch": {"microbatch_size": 2}, "lanes": 2,
                "cache": {"root": str(tmp_path / where / "cache")}}
        pipeline = DataRecipe.from_dict(data, source="s3.toml", base_dir=tmp_path).build()
        texts[where] = [r.payload["input_ids"].tobytes() for _, batch in
                        zip(range(5), pipeline, strict=False) for r in batch.records]
    assert texts["s3"] == texts["local"] and texts["local"]


def test_zephon_cache_lists_and_verifies_objects_it_holds(s3, two_datasets, tmp_path, capsys):
    from zephon.cli import main as zephon
    from zephon.io import CacheOptions, Dataset, StoreOptions

    s3.bucket("cached", {f"short/{p.name}": p.read_bytes()
                         for p in sorted(two_datasets["short"].iterdir())})
    root = tmp_path / "cache"
    dataset = Dataset.from_path("d", "s3://cached/short/").bound(
        StoreOptions(cache=CacheOptions(enabled=True, root=str(root)), show_progress=False))
    for data_file in dataset.files():
        with dataset.local_file(data_file):
            pass
    count = len(dataset.files())
    assert zephon(["cache", "ls", "--root", str(root)]) == 0
    listing = capsys.readouterr().out
    assert f"{count} shard(s)" in listing and "s3://cached/short/part-0.parquet" in listing
    assert zephon(["cache", "verify", "--root", str(root)]) == 0  # MD5s from the listing
    shard = max((root / "shards").iterdir(), key=lambda p: p.stat().st_size)
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])
    assert zephon(["cache", "verify", "--root", str(root)]) == 1
    assert "its bytes do not match" in capsys.readouterr().err


def test_a_litdata_recipe_is_checked_from_its_index_without_downloads(s3, tmp_path,
                                                                     tmp_path_factory,
                                                                     tokenizer_dir):
    from tests.core import litdata_sets

    local = litdata_sets.build(tmp_path_factory.getbasetemp() / "litdata-sets", "plain")
    upload(s3, "lit-recipes", local, prefix="train/")
    assert check_recipe(recipe_for(tmp_path, tokenizer_dir, "s3://lit-recipes/train/")) == []
    problems = check_recipe(recipe_for(tmp_path, tokenizer_dir, "s3://lit-recipes/train/",
                                       field="body"))
    chunks = len([p for p in local.iterdir() if p.name != "index.json"])
    assert len(problems) == chunks  # one a chunk, as one a file of other formats
    assert "s3://lit-recipes/train/chunk-0-0.bin: has no field 'body'" in problems[0]
    assert "its fields: 'text', 'id', 'tokens'" in problems[0]
    assert not any((tmp_path / "cache" / "shards").iterdir())  # the index sufficed
