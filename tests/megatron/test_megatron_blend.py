"""--data-path blends and --split with --dataloader zephon (Megatron indexed datasets)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from megatron_helpers import PACKED, parse

from zephon.io.indexed import write_indexed_dataset
from zephon_megatron.arguments import ZephonArgumentError, settings_from_args
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
    (["/a", "/b"], [(1.0, "/a"), (1.0, "/b")]),
    (["/a"], [(1.0, "/a")]),
    (["/a", "/b", "/c"], [(1.0, "/a"), (1.0, "/b"), (1.0, "/c")]),
])
def test_blend_syntax(values, expected):
    assert parse_blend(values) == expected


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


def test_a_data_path_blend_builds_split_recipes(indexed):
    args = args_for("--data-path", "0.7", indexed["web"], "0.3", indexed["code"],
                    "--split", "90,10,0", "--eval-iters", "2")
    settings = settings_from_args(args)
    assert settings.data_path and settings.recipe is None
    train, valid, test = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
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
    (["--train-data-path", "/x"], "--train-data-path conflicts"),
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
