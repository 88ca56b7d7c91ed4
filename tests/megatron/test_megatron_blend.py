"""--data-path blends and --split with --dataloader zephon (Megatron indexed datasets)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from megatron_helpers import PACKED, parse

from zephon.io.indexed import open_indexed, write_indexed_dataset
from zephon_megatron.arguments import ZephonArgumentError, settings_from_args, training_recipes
from zephon_megatron.blend import BlendError, parse_blend, split_ranges
from zephon_megatron.provider import Topology, ZephonDatasetsProvider

FLAGS = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--calculate-per-token-loss", "--transformer-impl", "local", "--dataloader", "zephon",
         "--zephon-lanes", "4", "--zephon-prefetch", "0", "--reset-position-ids",
         "--reset-attention-mask"]


@pytest.fixture
def indexed(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(3)
    out = {}
    for name, (low, high) in (("web", (10, 60)), ("code", (50, 300))):
        docs = [np.append(rng.integers(5, 900, size=int(rng.integers(low, high))), 2)
                for _ in range(400)]
        out[name] = write_indexed_dataset(tmp_path / f"{name}_text_document", docs)
    return out


def args_for(*extra: str) -> argparse.Namespace:
    return parse([*FLAGS, *extra])


@pytest.mark.parametrize("values, expected", [
    (["0.7", "/a", "0.3", "/b"], [(0.7, "/a"), (0.3, "/b")]),
    (["/a", "/b"], [(None, "/a"), (None, "/b")]),
    (["/a"], [(None, "/a")]),
    (["/a", "/b", "/c"], [(None, "/a"), (None, "/b"), (None, "/c")]),
])
def test_blend_syntax(values, expected):
    """Prefixes without weights keep no weight: they are weighed by size later."""
    assert parse_blend(values) == expected
    megatron = pytest.importorskip("megatron.core.datasets.utils")
    prefixes, weights = megatron.get_blend_from_list(values)
    assert [p for _, p in expected] == prefixes
    assert ([w for w, _ in expected] == weights) if weights else expected[0][0] is None


def test_mixed_or_negative_weights_are_errors():
    with pytest.raises(BlendError, match="mixes weights and prefixes"):
        parse_blend(["0.5", "/a", "/b", "/c"])
    with pytest.raises(BlendError, match=">= 0"):
        parse_blend(["-1", "/a", "2", "/b"])


@pytest.mark.parametrize("split", ["969,30,1", "98,2,0", "1,1,1", "80, 20", "100"])
@pytest.mark.parametrize("count", [1, 7, 100, 12345])
def test_split_ranges_follow_megatrons_rule(split, count):
    config = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_config")
    matrix = config.convert_split_vector_to_split_matrix(config.parse_and_normalize_split(split))
    expected = [(round(b[0] * count), round(b[1] * count)) if b is not None else None
                for b in matrix]
    ours = split_ranges(split, count)
    for mine, theirs in zip(ours, expected, strict=True):
        assert mine == theirs or (theirs is None and mine[0] == mine[1])


def megatron_sample_shares(prefixes: list[str], seq: int, samples: int, split: str,
                           cache: Path) -> list[float]:
    """Shares of the first ``samples`` training samples Megatron's own builder draws from each
    unweighted prefix (GPTDataset, BlendedMegatronDatasetBuilder, on CPU)."""
    from types import SimpleNamespace

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    tokenizer = SimpleNamespace(vocab_size=None, eod=2, pad=0,
                                unique_identifiers={"class": "stub"})
    config = GPTDatasetConfig(random_seed=1234, sequence_length=seq, tokenizer=tokenizer,
                              blend=get_blend_from_list(prefixes), split=split,
                              path_to_cache=str(cache), mmap_bin_files=False,
                              reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False)
    train = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True,
                                          config).build()[0]
    drawn = np.bincount(train.dataset_index[:samples], minlength=len(prefixes))
    return list(drawn / drawn.sum())


def test_unweighted_prefixes_blend_by_size_as_megatron_does(indexed, tmp_path, megatron_cpu):
    """--data-path A B without weights: the token shares are Megatron's sample shares (its
    weights are the one-epoch sample counts of each dataset's training split)."""
    pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
    prefixes = [indexed["web"], indexed["code"]]
    megatron = megatron_sample_shares(prefixes, 64, 500, "90,10,0", tmp_path / "cache")
    assert megatron[0] < 0.3  # the sizes differ about 1:4, far from 50/50
    args = args_for("--data-path", *prefixes, "--split", "90,10,0", "--eval-iters", "0")
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
    for _ in range(250):  # 500 rows of 64 tokens, Megatron's 500 samples
        next(train)
    tokens = {r.name: r.tokens for r in train.pipeline.loader().report().datasets}
    share = tokens["web_text_document"] / sum(tokens.values())
    assert abs(share - megatron[0]) < 0.01, (share, megatron)


def test_size_weights_are_megatrons_one_epoch_sample_counts(indexed):
    from zephon_megatron.blend import sample_counts

    dataset = open_indexed(indexed["code"])
    counts = sample_counts(dataset, "90,10,0", 64)
    tokens = int(dataset.lengths[:360].sum())
    assert counts[0] == (tokens - 1) // 64 and counts[2] == 0
    assert counts[1] == (int(dataset.lengths[360:].sum()) - 1) // 64


def test_megatrons_index_cache_beside_the_prefix_is_not_read(indexed):
    """Megatron-LM without --data-cache-path writes PREFIX/cache/GPTDataset_indices/."""
    cache = Path(indexed["web"]) / "cache" / "GPTDataset_indices"
    cache.mkdir(parents=True)
    (cache / "x-GPTDataset-train-description.txt").write_text("{}")
    args = args_for("--data-path", indexed["web"], "--split", "1,0,0", "--eval-iters", "0")
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
    assert next(train)["tokens"].shape == (2, 64)


def test_a_data_path_blend_builds_split_recipes(indexed, capsys):
    args = args_for("--data-path", "0.7", indexed["web"], "0.3", indexed["code"],
                    "--split", "90,10,0", "--eval-iters", "2")
    settings = settings_from_args(args)
    assert settings.data_path and settings.recipe is None
    train, valid, test = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
    said = capsys.readouterr().out
    assert said.count("unlike Megatron it mixes tokens, not samples") == 1, said
    assert test is None  # the split gives test no documents
    tokens = Counter()
    for _ in range(80):
        batch = next(train)
        assert batch["tokens"].shape == (2, 64)
    for record in train.pipeline.loader().report().datasets:
        tokens[record.name] = record.tokens
    share = tokens["web_text_document"] / sum(tokens.values())
    assert abs(share - 0.7) < 0.02
    assert next(valid)["tokens"].shape == (2, 64)
    spans = {d.name: d for d in train.pipeline.loader().source.datasets}
    assert spans["web_text_document"].documents == (0, 360)
    assert {d.documents for d in valid.pipeline.loader().source.datasets} == {(360, 400)}


@pytest.mark.parametrize("extra, message", [
    (["--mock-data"], "--mock-data conflicts"),
    (["--valid-data-path", "/x"], "--valid-data-path needs --train-data-path"),
    (["--split", "1,0,0", "--zephon-recipe", str(PACKED)], "--split is only read with"),
    (["--data-path", "/nowhere/x"], r"no /nowhere/x\.idx"),
])
def test_megatron_data_flags_are_checked(extra, message):
    with pytest.raises(ZephonArgumentError, match=message):
        settings_from_args(args_for(*extra))


def test_an_options_recipe_must_not_name_datasets(indexed):
    with pytest.raises(ZephonArgumentError, match=r"\[\[datasets\]\] conflicts"):
        settings_from_args(args_for("--data-path", indexed["web"], "--zephon-recipe",
                                    str(PACKED)))


def test_a_data_path_blend_keeps_its_fixed_weights(indexed, tmp_path):
    options = tmp_path / "options.toml"
    options.write_text('[mixture]\nby = "tokens"\n[[mixture.stages]]\nuntil_tokens = 1000\n'
                       'weights = { web_text_document = 1.0 }\n[[mixture.stages]]\n'
                       'weights = { web_text_document = 0.5, code_text_document = 0.5 }\n')
    args = args_for("--data-path", "0.7", indexed["web"], "0.3", indexed["code"],
                    "--zephon-recipe", str(options))
    with pytest.raises(ZephonArgumentError, match=r"\[\[mixture.stages\]\] conflicts with "
                                                  "--data-path"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    args = args_for("--data-path", "0.7", indexed["web"], "0.3", indexed["code"])
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    assert train.pipeline.work_source.schedule.static


def test_eod_mask_loss_needs_the_eod_of_token_id_data(indexed, tmp_path):
    args = args_for("--data-path", indexed["web"], "--eod-mask-loss")
    with pytest.raises(ZephonArgumentError, match="EOD id"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    options = tmp_path / "options.toml"
    options.write_text("[to_training]\neos_token_id = 2\n")  # the data ends in EOD already
    args = args_for("--data-path", indexed["web"], "--eod-mask-loss", "--zephon-recipe",
                    str(options))
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    batch = next(train)
    eod = batch["tokens"] == 2
    assert eod.any() and (batch["loss_mask"][eod] == 0).all()


def datasets_of(recipe) -> list[tuple[str, float, list[int]]]:
    return [(d.name, d.weight, d.documents) for d in recipe.datasets]


def test_data_args_path_holds_the_data_path_values(indexed, tmp_path):
    """--data-args-path FILE: the --data-path values as text, split on whitespace."""
    blend_file = tmp_path / "blend.txt"
    blend_file.write_text(f"0.7 {indexed['web']}\n0.3   {indexed['code']}\n")
    from_file = settings_from_args(args_for("--data-args-path", str(blend_file),
                                            "--split", "90,10,0"))
    given = settings_from_args(args_for("--data-path", "0.7", indexed["web"], "0.3",
                                        indexed["code"], "--split", "90,10,0"))
    assert from_file.data_path == given.data_path
    ours, theirs = training_recipes(from_file), training_recipes(given)
    for role in ("train", "valid"):
        assert datasets_of(ours[role]) == datasets_of(theirs[role])
    assert ours["test"] is None


def test_per_split_data_args_path_gives_a_blend_per_split(indexed, tmp_path):
    """--per-split-data-args-path FILE: JSON train/valid/test blends, each read whole (no
    --split), unweighted prefixes weighed by size; a string is split, null gives no data."""
    blend_file = tmp_path / "blend.json"
    blend_file.write_text(json.dumps({"train": [indexed["web"], indexed["code"]],
                                      "valid": f"1 {indexed['code']}", "test": None}))
    args = args_for("--per-split-data-args-path", str(blend_file), "--eval-iters", "1")
    settings = settings_from_args(args)
    recipes = training_recipes(settings)
    train = datasets_of(recipes["train"])
    assert [d[2] for d in train] == [[0, 400], [0, 400]]
    web, code = (open_indexed(indexed[n]) for n in ("web", "code"))
    assert [d[1] for d in train] == [(int(web.lengths.sum()) - 1) // 64,
                                     (int(code.lengths.sum()) - 1) // 64]
    assert datasets_of(recipes["valid"]) == [("code_text_document", 1.0, [0, 400])]
    assert recipes["test"] is None
    same = settings_from_args(args_for("--train-data-path", indexed["web"], indexed["code"],
                                       "--valid-data-path", "1", indexed["code"],
                                       "--eval-iters", "1"))
    assert same.per_split == settings.per_split
    _, valid, test = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
    assert next(valid)["tokens"].shape == (2, 64) and test is None


@pytest.mark.parametrize("content, message", [
    ({"train": ["/x"], "valid": None}, r"needs the keys .*missing \['test'\]"),
    ({"train": None, "valid": None, "test": None}, "'train' names no dataset"),
    ({"train": [1, 2], "valid": None, "test": None}, "must be a list of strings"),
    ("not json", "not JSON"),
])
def test_bad_per_split_files_are_named(tmp_path, content, message):
    blend_file = tmp_path / "blend.json"
    blend_file.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ZephonArgumentError, match=message):
        settings_from_args(args_for("--per-split-data-args-path", str(blend_file)))


def test_one_data_source_only(indexed, tmp_path):
    blend_file = tmp_path / "blend.txt"
    blend_file.write_text(indexed["web"])
    with pytest.raises(ZephonArgumentError, match="--data-path conflicts with --data-args-path"):
        settings_from_args(args_for("--data-path", indexed["web"], "--data-args-path",
                                    str(blend_file)))
    with pytest.raises(ZephonArgumentError, match="--data-args-path conflicts with "
                                                  "--per-split-data-args-path"):
        settings_from_args(args_for("--data-args-path", str(blend_file),
                                    "--per-split-data-args-path", str(blend_file)))
    with pytest.raises(ZephonArgumentError, match="--split is only read with --data-path"):
        settings_from_args(args_for("--train-data-path", indexed["web"], "--split", "9,1,0"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ZephonArgumentError, match=r"--data-args-path .* is empty"):
        settings_from_args(args_for("--data-args-path", str(empty)))


def test_a_missing_data_source_names_every_flag():
    with pytest.raises(ZephonArgumentError) as error:
        settings_from_args(args_for())
    for flag in ("--zephon-recipe", "--data-path", "--data-args-path",
                 "--per-split-data-args-path"):
        assert flag in str(error.value)


def inside_megatron(monkeypatch, tokenizer) -> None:
    """Megatron-LM's global tokenizer, as ``pretrain()`` sets it up."""
    import sys
    from types import ModuleType

    training = ModuleType("megatron.training")
    training.get_tokenizer = lambda: tokenizer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.training", training)


def test_eod_mask_loss_with_nulltokenizers_eod_is_an_error(indexed, monkeypatch):
    """NullTokenizer's EOD is made up from --vocab-size, not the data's EOD: masking by it
    would mask nothing (or, in megatron-core 0.19, the wrong labels)."""
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    null = NullTokenizer(1000)  # EOD 1000 in megatron-core 0.16, 999 in 0.19
    inside_megatron(monkeypatch, null)
    args = args_for("--data-path", indexed["web"], "--eod-mask-loss")
    with pytest.raises(ZephonArgumentError, match=rf"--eod-mask-loss: the EOD id {null.eod} "
                                                  r".*NullTokenizer.*eos_token_id"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    inside_megatron(monkeypatch, type("GPT2BPETokenizer", (), {"eod": 2})())
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    assert (next(train)["loss_mask"] == 0).any()  # a real tokenizer's EOD: masked


def test_an_eod_id_beyond_the_vocabulary_is_an_error(indexed, tmp_path):
    options = tmp_path / "options.toml"
    options.write_text("[tokenize]\nkind = \"pretokenized\"\nvocab_size = 1000\n"
                       "[to_training]\neos_token_id = 1000\n")
    args = args_for("--data-path", indexed["web"], "--eod-mask-loss", "--zephon-recipe",
                    str(options))
    with pytest.raises(ZephonArgumentError, match=r"--eod-mask-loss .* EOD id 1000, but the "
                                                  r"data's ids are 0\.\.999"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)


def test_the_start_up_line_names_the_split_only_when_one_was_given() -> None:
    from types import SimpleNamespace

    from zephon_megatron.provider import blend_differences

    given = blend_differences(SimpleNamespace(per_split=None, split="98,2,0"))
    default = blend_differences(SimpleNamespace(per_split=None, split=None))
    per_split = blend_differences(SimpleNamespace(per_split=(("a",), None, None), split=None))
    assert "--split 98,2,0 cuts documents" in given
    assert "default split 969,30,1 (no --split given)" in default
    assert "--split" not in per_split and "read whole" in per_split
