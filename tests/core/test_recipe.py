"""Data recipes: validation before anything is read, and pipelines built from them."""

from __future__ import annotations

import dataclasses

import pytest

from zephon.errors import ConfigError, DataError
from zephon.ops.batch import BatchSpec
from zephon.recipe import DataRecipe, FrameworkValues, RecipeProblems

RECIPE = """
seed = 3
lanes = 2

[[datasets]]
name = "short"
path = "data/short"
weight = 0.6

[[datasets]]
name = "long"
path = "data/long"
weight = 0.4

[tokenize]
tokenizer = "{tokenizer}"

[pack]
algorithm = "best_fit"

[shuffle]
buffer_size = 4

[to_training]
return_labels = true
eos_mask_loss = true
"""


@pytest.fixture
def recipe_file(two_datasets, tokenizer_dir):
    path = two_datasets["short"].parent.parent / "recipe.toml"
    path.write_text(RECIPE.format(tokenizer=tokenizer_dir))
    return path


def test_builds_a_pipeline_packed_to_seq_len_plus_one(recipe_file, tokenizer_dir):
    from zephon.text.tokenizer import load_tokenizer

    recipe = DataRecipe.from_toml(recipe_file)
    pipeline = recipe.build(seq_len=64, microbatch_size=2, dp_rank=1, dp_world_size=2)
    batch = next(iter(pipeline))
    assert batch.lane == 1 and len(batch) == 2
    options = recipe.training_options()
    assert options["eos_token_id"] == load_tokenizer(tokenizer_dir).eos_token_id
    out = batch.to_training(**options)
    assert out["input_ids"].shape == (2, 64)


@pytest.mark.parametrize("edit, message", [
    (("weight = 0.6", "wieght = 0.6"), r"unknown key\(s\) \['wieght'\] in \[datasets\]"),
    (("seed = 3", "seed = 3\nepochs = 2"), r"unknown key\(s\) \['epochs'\]"),
    (('path = "data/short"', 'path = "data/nowhere"'), "dataset 'short'.*does not exist"),
    (("[tokenize]\n", "[tokenize]\nfield = 'text'\n"), None),
    (("return_labels = true", "return_labels = false"), "needs return_labels"),
])
def test_recipe_errors_name_the_problem(recipe_file, edit, message):
    recipe_file.write_text(recipe_file.read_text().replace(*edit))
    if message is None:
        DataRecipe.from_toml(recipe_file)
        return
    with pytest.raises(ConfigError, match=message) as info:
        DataRecipe.from_toml(recipe_file)
    assert "recipe.toml" in str(info.value)


def test_missing_tokenizer_fails_before_reading(recipe_file, tmp_path):
    text = recipe_file.read_text()
    start = text.index('tokenizer = "') + len('tokenizer = "')
    end = text.index('"', start)
    recipe_file.write_text(text[:start] + str(tmp_path / "no-tokenizer") + text[end:])
    with pytest.raises(ConfigError, match=r"tokenizer directory .* does not exist"):
        DataRecipe.from_toml(recipe_file)


def test_framework_values_conflicting_with_recipe(recipe_file):
    recipe_file.write_text(recipe_file.read_text().replace(
        '[pack]\nalgorithm = "best_fit"', '[pack]\nalgorithm = "best_fit"\nmax_length = 33'))
    recipe = DataRecipe.from_toml(recipe_file)
    with pytest.raises(ConfigError, match="max_length = 33 conflicts with the framework's "
                       r"sequence length 64 \(rows are seq_len \+ 1 = 65"):
        recipe.build(seq_len=64, microbatch_size=2)
    assert recipe.build(seq_len=32, microbatch_size=2) is not None


def test_resolve_fills_the_framework_holes_and_lists_every_conflict(recipe_file):
    """Holes (row length, microbatch rows, lanes) are filled from the framework; values the
    recipe fixes must agree, and every disagreement is listed at once, naming the option."""
    recipe = dataclasses.replace(DataRecipe.from_toml(recipe_file), lanes=None)
    assert recipe.pack.max_length is None and recipe.batch.microbatch_size is None  # holes
    open_recipe = recipe.resolve()
    assert open_recipe.max_length is None and open_recipe.microbatch_size is None
    assert [s.op_name for s in open_recipe.operators] == ["tokenize", "pack_flat", "shuffle",
                                                             "batch"]
    with pytest.raises(ConfigError, match="max_length is open"):
        open_recipe.operators[1].build(None)
    with pytest.raises(ConfigError, match="framework gave no sequence length"):
        open_recipe.build()
    resolved = recipe.resolve(FrameworkValues(seq_len=31, microbatch_size=2, dp_size=2,
                                              lanes=4))
    assert (resolved.max_length, resolved.microbatch_size, resolved.lanes) == (32, 2, 4)
    assert [s.op_name for s in resolved.operators] == ["tokenize", "pack_flat", "shuffle",
                                                          "batch"]
    assert resolved.datasets[0] is recipe.resolve().datasets[0], "datasets are listed once"
    pipeline = resolved.build(dp_rank=1)
    assert (pipeline.lanes, pipeline.loader_options.dp_world_size) == (4, 2)
    first = next(iter(pipeline))
    assert first.lane == 1 and len(first) == 2
    assert all(len(r.payload["input_ids"]) == 32 for r in first.records)
    fixed = dataclasses.replace(recipe, lanes=8,
                                pack=dataclasses.replace(recipe.pack, max_length=65),
                                batch=BatchSpec(microbatch_size=3))
    with pytest.raises(RecipeProblems) as caught:
        fixed.resolve(FrameworkValues(seq_len=31, microbatch_size=2, lanes=4,
                                      flags={"microbatch_size": "--mbs"}))
    assert len(caught.value.problems) == 3
    assert "microbatch_size = 3 conflicts with the framework's 2 (--mbs)" in str(caught.value)
    assert fixed.resolve(FrameworkValues(seq_len=64, microbatch_size=3)).lanes == 8


def test_chat_recipe(tmp_path):
    from zephon.demo.assets import build_chat_assets

    assets = build_chat_assets(tmp_path, n=30)
    recipe = DataRecipe.from_dict({
        "datasets": [{"name": "chat", "path": assets["chat"]}],
        "tokenize": {"kind": "chat", "tokenizer": assets["tokenizer"], "train_on": "last"},
        "to_training": {"return_labels": True, "return_loss_mask": True},
    })
    batch = next(iter(recipe.build(seq_len=96, microbatch_size=2)))
    out = batch.to_training(**recipe.training_options())
    assert 0 < float(out["loss_mask"].mean()) < 0.6
    with pytest.raises(ConfigError, match=r"\['add_bos'\] do not apply to kind='chat'"):
        DataRecipe.from_dict({"datasets": [{"name": "c", "path": assets["chat"]}],
                              "tokenize": {"kind": "chat", "tokenizer": assets["tokenizer"],
                                           "add_bos": True}})


def test_one_mixing_default_for_recipes_and_python(recipe_file):
    from zephon.work import StaticMixtureWorkSource

    text = recipe_file.read_text()
    by_documents = DataRecipe.from_toml(recipe_file)
    assert by_documents.mix_by == "documents"
    source = by_documents.build(seq_len=64, microbatch_size=2).work_source
    assert source.token_estimation is None and not source.by_tokens
    recipe_file.write_text(text + '\n[mixture]\nprimer = "bytes"\n')
    by_tokens = DataRecipe.from_toml(recipe_file)
    assert by_tokens.mix_by == "tokens"
    assert by_tokens.build(seq_len=64, microbatch_size=2).work_source.by_tokens
    assert isinstance(source, StaticMixtureWorkSource)


@pytest.mark.parametrize("section, message", [
    ('[mixture]\non_exhausted = "drian"\n', r"\[mixture\] on_exhausted='drian' is not one of"),
    ('[mixture]\nrepeat = ["wiki"]\n', r"repeat names unknown datasets \['wiki'\]"),
    ("[shuffle]\nbuffer_size = 0\n", r"\[shuffle\] shuffle: buffer_size"),
    ("[batch]\nmicrobatch_size = '4'\n", r"microbatch_size = '4' in \[batch\] must be an"),
    ('[[ops]]\nop = "filter"\nfn = "tests.core.toy_ops:missing"\n', "has no 'missing'"),
])
def test_option_values_fail_when_the_recipe_is_read(recipe_file, section, message):
    text = recipe_file.read_text().replace("[shuffle]\nbuffer_size = 4\n", "")
    recipe_file.write_text(text + "\n" + section)
    with pytest.raises(ConfigError, match=message) as info:
        DataRecipe.from_toml(recipe_file)
    assert "recipe.toml" in str(info.value)


def test_chat_roles_from_a_recipe(tmp_path):
    from zephon.demo.assets import build_chat_assets

    assets = build_chat_assets(tmp_path, n=30)
    base = {"datasets": [{"name": "chat", "path": assets["chat"]}],
            "tokenize": {"kind": "chat", "tokenizer": assets["tokenizer"]}}
    everything = DataRecipe.from_dict(base).build(seq_len=96, microbatch_size=2)
    list(everything)
    strict = DataRecipe.from_dict({**base, "tokenize": {
        **base["tokenize"], "roles": ["user", "assistant"]}}).build(seq_len=96, microbatch_size=2)
    with pytest.raises(DataError, match="every one was dropped"):  # every one has a system turn
        list(strict)
    [loose], [tight] = everything.report().datasets, strict.report().datasets
    assert tight.skipped.get("unknown_role", 0) > loose.skipped.get("unknown_role", 0)


def test_every_problem_of_a_recipe_is_reported_at_once(recipe_file):
    from zephon.recipe import RecipeProblems

    text = (recipe_file.read_text().replace("weight = 0.6", "wieght = 0.6")
            .replace("buffer_size = 4", "buffer_size = 0")
            .replace('path = "data/long"', 'path = "data/nowhere"'))
    recipe_file.write_text(text + '\n[mixture]\non_exhausted = "drian"\n')
    with pytest.raises(RecipeProblems) as info:
        DataRecipe.from_toml(recipe_file)
    problems = info.value.problems
    assert len(problems) == 4, problems  # an unknown key hides nothing else
    assert any("unknown key(s) ['wieght'] in [datasets]" in p for p in problems)
    assert any("dataset 'long'" in p and "does not exist" in p for p in problems)
    assert any("on_exhausted='drian'" in p for p in problems)
    assert any("buffer_size" in p for p in problems)
    assert all("recipe.toml" in p for p in problems)
    assert str(info.value).startswith(f"{recipe_file}: 4 problems:")


def test_datasets_with_their_own_fields_and_kinds(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import write_jsonl
    from zephon.demo.assets import make_documents
    from zephon.text.tokenizer import load_tokenizer

    texts = make_documents(40, seed=3)
    write_jsonl(tmp_path / "wiki.jsonl", [{"content": t} for t in texts[:20]])
    pq.write_table(pa.table({"body": texts[20:]}), tmp_path / "web.parquet")
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = [tokenizer(t)["input_ids"] for t in texts[:10]]
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}),
                   tmp_path / "ids.parquet")
    recipe = DataRecipe.from_dict({
        "lanes": 1,
        "datasets": [{"name": "wiki", "path": str(tmp_path / "wiki.jsonl"), "field": "content"},
                     {"name": "web", "path": str(tmp_path / "web.parquet"), "field": "body"},
                     {"name": "ids", "path": str(tmp_path / "ids.parquet"), "field": "ids",
                      "kind": "pretokenized"}],
        "mixture": {"on_exhausted": "drain"},
        "tokenize": {"tokenizer": tokenizer_dir},
        "batch": {"drop_last": False}})
    pipeline = recipe.build(seq_len=64, microbatch_size=2)
    assert [s.op_name for s in pipeline.operators][:3] == ["tokenize", "tokenize",
                                                           "pretokenized"]
    list(pipeline)
    report = {d.name: d.documents for d in pipeline.report().datasets}
    assert report == {"wiki": 20, "web": 20, "ids": 10}


def test_pretokenized_datasets_in_a_text_recipe_may_take_the_tokenizers_separators(
        tmp_path, tokenizer_dir):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import write_jsonl
    from zephon.demo.assets import make_documents
    from zephon.errors import DataError
    from zephon.text.tokenizer import load_tokenizer

    texts = make_documents(30, seed=5)
    tokenizer = load_tokenizer(tokenizer_dir)
    write_jsonl(tmp_path / "text" / "a.jsonl", [{"text": t} for t in texts[:10]])
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[10:]]
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}),
                   tmp_path / "ids.parquet")

    def documents(**entry) -> list[np.ndarray]:
        recipe = DataRecipe.from_dict({
            "lanes": 1,
            "datasets": [{"name": "text", "path": str(tmp_path / "text")},
                         {"name": "ids", "path": str(tmp_path / "ids.parquet"),
                          "field": "ids", "kind": "pretokenized", **entry}],
            "mixture": {"on_exhausted": "drain"}, "tokenize": {"tokenizer": tokenizer_dir},
            "pack": {"max_length": 4097, "algorithm": "best_fit"},
            "batch": {"drop_last": False}})
        pipeline = recipe.build(seq_len=4096, microbatch_size=1)
        return [r.payload["input_ids"][s.row_start:s.row_start + s.length]
                for b in pipeline for r in b.records for s in r.meta["documents"]
                if s.dataset == "ids"]

    eos = tokenizer.eos_token_id
    plain = documents()
    assert len(plain) == 20 and not any(eos in d for d in plain)  # ids as written
    separated = documents(add_eos=True)
    assert all(d[-1] == eos and eos not in d[:-1] for d in separated)
    assert sorted(d[:-1].tolist() for d in separated) == sorted(d.tolist() for d in plain)
    with pytest.raises(ConfigError, match=r"'text': add_eos applies to a kind = "
                                          r"\"pretokenized\" dataset"):
        DataRecipe.from_dict({"datasets": [{"name": "text", "path": str(tmp_path / "text"),
                                            "add_eos": True}],
                              "tokenize": {"tokenizer": tokenizer_dir}})
    ids[3][2] = len(tokenizer) + 5  # an id past the tokenizer's vocabulary
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}),
                   tmp_path / "ids.parquet")
    with pytest.raises(DataError, match=r"ids\.parquet"):
        documents()


def test_read_ahead_budget_from_a_recipe(recipe_file):
    recipe_file.write_text(recipe_file.read_text().replace("lanes = 2", "lanes = 2\n"
                                                           "read_ahead_tokens = 2000"))
    pipeline = DataRecipe.from_toml(recipe_file).build(seq_len=64, microbatch_size=2)
    assert pipeline.loader_options.read_ahead_tokens == 2000
    # a round is 2 lanes x 2 rows x 65 tokens: 7 rounds fit in 2000 tokens
    assert pipeline.loader().stream.rounds_ahead == 7
    recipe_file.write_text(recipe_file.read_text().replace("read_ahead_tokens = 2000",
                                                           "read_ahead_tokens = 0"))
    with pytest.raises(ConfigError, match="read_ahead_tokens must be an integer >= 1"):
        DataRecipe.from_toml(recipe_file).build(seq_len=64, microbatch_size=2)


def test_split_special_tokens_is_a_recipe_key_in_the_fingerprint(recipe_file):
    def tokenize_fingerprint(text: str) -> dict:
        recipe_file.write_text(text)
        pipeline = DataRecipe.from_toml(recipe_file).build(seq_len=64, microbatch_size=2)
        [op] = [op for op in pipeline.fingerprint()["ops"] if op["op"] == "tokenize"]
        return op

    text = recipe_file.read_text()
    assert tokenize_fingerprint(text)["split_special_tokens"] is True
    kept = text.replace("[tokenize]\n", "[tokenize]\nsplit_special_tokens = false\n")
    assert tokenize_fingerprint(kept)["split_special_tokens"] is False
    wrong = text.replace("[tokenize]\n", '[tokenize]\nsplit_special_tokens = "no"\n')
    recipe_file.write_text(wrong)
    with pytest.raises(ConfigError, match="split_special_tokens"):
        DataRecipe.from_toml(recipe_file)
