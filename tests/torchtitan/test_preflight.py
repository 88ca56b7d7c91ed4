"""Every TorchTitan route checks the data recipe against the run before the model is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_torchtitan_tools.demo import run_training

pytestmark = pytest.mark.slow

LAUNCH = """\
dump_folder = "out"
[base]
module = "llama3"
config = "llama3_debugmodel"
{vocab}
[training]
seq_len = 64
steps = 2
[dataloader]
name = "zephon"
recipe = "data.toml"
"""


def broken_recipe(tmp_path: Path, recipes) -> Path:
    """Two datasets, one whose file lacks the text field, and lanes = 3."""
    (tmp_path / "other").mkdir(exist_ok=True)
    (tmp_path / "other" / "a.jsonl").write_text('{"body": "no text field here"}\n')
    datasets = recipes.demo() + '\n[[datasets]]\nname = "other"\npath = "other"\n'
    return recipes.write(tmp_path / "data.toml", datasets=datasets, lanes=3)


def assert_refused_before_the_model(code: int, output: str, *needles: str) -> None:
    assert code != 0, output[-3000:]
    assert "zephon preflight found problems before the model is built" in output, output[-3000:]
    for needle in needles:
        assert needle in output, (needle, output[-3000:])
    assert "Building llama3" not in output  # TorchTitan's model-construction log line


def test_launcher_route(tmp_path, recipes):
    broken_recipe(tmp_path, recipes)
    text = (tmp_path / "data.toml").read_text().replace('algorithm = "wrap"',
                                                        'algorithm = "wrap"\nmax_length = 33')
    (tmp_path / "data.toml").write_text(text + "[batch]\nmicrobatch_size = 3\n")
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"'))
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml")], nproc=2,
                                   cwd=tmp_path, timeout=300)
    assert_refused_before_the_model(
        code, output, "a.jsonl: has no field 'text'", "lanes = 3: 3 lanes cannot be shared by "
        "2 data-parallel readers", "[pack] max_length = 33 conflicts",
        "(--training.seq_len)", "microbatch_size = 3 conflicts with the framework's 8 "
        "(--training.local_batch_size)")
    # rank 0 lists the problems (its traceback, and torchrun's summary when it failed first);
    # rank 1 only points there (every rank used to list them: 4 copies with 2 ranks)
    assert output.count("a.jsonl: has no field 'text'") <= 2, output[-6000:]
    assert "found 4 problem(s) before the model is built; global rank 0 lists them" in output


def test_override_route_refuses_a_tokenizer_larger_than_the_model(tmp_path, recipes):
    recipe = recipes.write(tmp_path / "data.toml", datasets=recipes.demo())  # 4096 tokens
    target = "zephon_torchtitan.override.zephon_dataloader=" + json.dumps({"recipe": str(recipe)})
    code, output, _ = run_training(
        ["-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel",
         "--override.imports", target, "--training.seq_len", "64", "--training.steps", "2",
         "--training.disable_cuda_graphs", "--parallelism.spmd_backend", "partial_dtensor",
         "--validator.no-enable", "--dump_folder", str(tmp_path / "out")],
        cwd=tmp_path, module="zephon_torchtitan_tools.cpu_shims", torchrun=True, timeout=300)
    assert_refused_before_the_model(code, output, "has 4096 tokens but the model's "
                                    "vocabulary has 2048")


def test_config_registry_route(tmp_path, recipes, monkeypatch):
    broken_recipe(tmp_path, recipes)
    registry = tmp_path / "recipes"
    (registry / "data").mkdir(parents=True)
    (registry / "data" / "pretrain_docmask.toml").write_text(
        (tmp_path / "data.toml").read_text().replace(
            'path = "other"', f'path = "{tmp_path / "other"}"'))
    (registry / "data" / "validation.toml").write_text(
        (recipes.root / "data" / "validation.toml").read_text())
    monkeypatch.setenv("ZEPHON_TORCHTITAN_RECIPES", str(registry))
    code, output, _ = run_training(
        ["-m", "torchtitan.train", "--module", "zephon_torchtitan", "--config",
         "zephon_llama3_debugmodel", "--training.seq_len", "64", "--training.steps", "2",
         "--validator.no-enable", "--dump_folder", str(tmp_path / "out")],
        cwd=tmp_path, module="zephon_torchtitan_tools.cpu_shims", torchrun=True, timeout=300)
    assert_refused_before_the_model(code, output, "a.jsonl: has no field 'text'")


def two_fields(tmp_path: Path, recipes) -> Path:
    """The demo corpus ('text' in Parquet) mixed with a JSON Lines source whose documents are
    in 'content'."""
    from zephon.demo.assets import make_documents

    (tmp_path / "notes").mkdir(exist_ok=True)
    (tmp_path / "notes" / "a.jsonl").write_text("".join(
        json.dumps({"content": t}) + "\n" for t in make_documents(200, seed=4)))
    datasets = (recipes.demo() + '\n[[datasets]]\nname = "notes"\npath = "notes"\n'
                'field = "content"\n')
    return recipes.write(tmp_path / "data.toml", datasets=datasets, lanes=2)


def test_a_bad_option_value_stops_the_launcher_before_torchtitan(tmp_path, recipes):
    recipes.write(tmp_path / "data.toml", datasets=recipes.demo(),
                  extra='[shuffle]\nbuffer_size = 4\nseed = "x"\n')
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"'))
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml")], cwd=tmp_path,
                                   timeout=300)
    assert code != 0
    assert "data.toml: seed = 'x' in [shuffle] must be an integer" in output
    assert "Building llama3" not in output


def test_a_changed_lane_count_or_seed_at_resume_is_refused_before_the_model(tmp_path,
                                                                           recipes):
    data = recipes.write(tmp_path / "data.toml", datasets=recipes.demo(), lanes=2)
    data.write_text(data.read_text().replace("lanes = 2\n", ""))  # lanes from the loader
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"')
                                          + "lanes = 2\n[checkpoint]\nenable = true\n"
                                          "interval = 2\n")
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml")], cwd=tmp_path,
                                   timeout=300)
    assert code == 0, output[-4000:]
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml"),
                                    "--training.steps", "4", "--dataloader.lanes", "4"],
                                   cwd=tmp_path, timeout=300)
    assert_refused_before_the_model(code, output,
                                    "the lane count changed (lanes: checkpoint 2, now 4)")
    assert "Missing key" not in output
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml"),
                                    "--training.steps", "4", "--dataloader.seed", "8"],
                                   cwd=tmp_path, timeout=300)
    assert_refused_before_the_model(code, output, "written by a different pipeline: the seed",
                                    "--checkpoint.exclude_from_loading dataloader")
    code, output, losses = run_training(["--toml", str(tmp_path / "launch.toml"),
                                         "--training.steps", "4"], cwd=tmp_path, timeout=300)
    assert code == 0, output[-4000:]  # the same loader resumes
    assert sorted(losses) == [3, 4]


def test_the_model_follows_a_recipe_named_on_the_command_line(tmp_path, recipes,
                                                              small_tokenizer):
    """The registry's config is sized to its own recipe's 4096-token tokenizer; naming a
    recipe with a 2048-token tokenizer on the command line resizes the model and points
    TorchTitan's tokenizer at it, instead of failing after the model is built."""
    small = recipes.write(tmp_path / "small.toml", datasets=recipes.demo(),
                          tokenizer=small_tokenizer)
    code, output, losses = run_training(
        ["-m", "torchtitan.train", "--module", "zephon_torchtitan", "--config",
         "zephon_llama3_debugmodel", "--dataloader.recipe", str(small), "--training.seq_len",
         "64", "--training.steps", "2", "--validator.no-enable", "--checkpoint.no-enable",
         "--dump_folder", str(tmp_path / "out")],
        cwd=tmp_path, module="zephon_torchtitan_tools.cpu_shims", torchrun=True, timeout=300)
    assert code == 0, output[-4000:]
    assert "zephon: model vocabulary 4096 -> 2048" in output
    assert f"zephon: hf_assets_path = {small_tokenizer}" in output
    assert sorted(losses) == [1, 2]


def test_the_launchers_fitted_vocabulary_follows_the_command_line_recipe(tmp_path, recipes,
                                                                         small_tokenizer):
    """The launch TOML names a 4096-token recipe; the command line names one with a
    2048-token tokenizer, whose two sources keep their documents in different fields: the
    model is sized to the command line's, and both sources train."""
    recipes.write(tmp_path / "data.toml", datasets=recipes.demo())  # 4096 tokens
    two_fields(tmp_path, recipes)  # rewrites data.toml: the demo corpus and 'content' notes
    small = tmp_path / "small.toml"
    small.write_text((tmp_path / "data.toml").read_text()
                     .replace('tokenizer = "demo:tokenizer"', f'tokenizer = "{small_tokenizer}"')
                     .replace('[mixture]\nby = "documents"',
                              '[mixture]\nby = "documents"\nrepeat = true'))
    recipes.write(tmp_path / "data.toml", datasets=recipes.demo())  # 4096 tokens again
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"'))
    code, output, losses = run_training(
        ["--toml", str(tmp_path / "launch.toml"), "--dataloader.recipe", str(small)],
        cwd=tmp_path, timeout=300)
    assert code == 0, output[-4000:]
    assert "zephon: model vocabulary 4096 -> 2048" in output
    assert "zephon: preflight passed" in output
    assert sorted(losses) == [1, 2]


def test_a_torchtitan_tokenizer_other_than_the_recipes_is_refused_before_the_model(
        tmp_path, recipes, small_tokenizer):
    """--hf_assets_path naming another tokenizer than the recipe's was found by the loader,
    after the model was built, once a rank; the preflight finds it first."""
    recipes.write(tmp_path / "data.toml", datasets=recipes.demo())  # 4096 tokens
    (tmp_path / "launch.toml").write_text(LAUNCH.format(vocab='vocab_size = "tokenizer"'))
    code, output, _ = run_training(["--toml", str(tmp_path / "launch.toml"),
                                    "--hf_assets_path", small_tokenizer], cwd=tmp_path,
                                   timeout=300)
    assert_refused_before_the_model(code, output, "has 4096 tokens but TorchTitan's tokenizer",
                                    f"({small_tokenizer}) has 2048")
