"""The model's vocabulary before Megatron builds its tokenizer, and the recipe read with it:
the preflight and the provider must build the same fingerprint (a resume compares them)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from types import SimpleNamespace

import pytest
from megatron_helpers import parse

from zephon.demo.assets import build_demo_assets
from zephon_megatron.adapter_error import ZephonArgumentError
from zephon_megatron.vocabulary import model_vocabulary, null_tokenizer_adds_eod, run_recipe

HF = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model"]


def test_token_ids_beyond_the_models_vocabulary_name_the_flag() -> None:
    recipe = SimpleNamespace(tokenizer=None, tokenize={"vocab_size": 5000}, source="ids.toml")
    with pytest.raises(ZephonArgumentError, match=r"larger than the model's vocabulary "
                                                  r"\(4096\); size the model for it with "
                                                  r"--vocab-size 5000"):
        run_recipe(recipe, argparse.Namespace(padded_vocab_size=4096))


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """What run_recipe reads of a recipe of token ids."""

    tokenizer: None
    tokenize: dict
    source: str = "ids.toml"


def test_token_id_recipes_take_the_model_vocabulary_as_their_bound() -> None:
    args = parse(["--vocab-size", "4096"])  # the entry's NullTokenizer
    read = run_recipe(TokenIds(None, {"kind": "pretokenized"}), args)
    assert read.tokenize["vocab_size"] == model_vocabulary(args)
    assert model_vocabulary(args) == (4224 if null_tokenizer_adds_eod() else 4096)
    assert run_recipe(TokenIds(None, {"vocab_size": 100}), args).tokenize == {"vocab_size": 100}
    unknown = parse(["--tokenizer-type", "GPT2BPETokenizer"])
    assert model_vocabulary(unknown) is None  # sized by Megatron: the provider checks
    assert run_recipe(TokenIds(None, {}), unknown).tokenize == {}


def test_the_version_rule_of_the_null_tokenizer() -> None:
    assert null_tokenizer_adds_eod("0.16.1") and null_tokenizer_adds_eod("0.18.2")
    assert not null_tokenizer_adds_eod("0.19.2") and not null_tokenizer_adds_eod("0.20.0rc1")


@pytest.mark.skipif(importlib.util.find_spec("megatron.training") is None,
                    reason="Megatron-LM (megatron.training) is not on PYTHONPATH")
@pytest.mark.parametrize("argv", [
    ["--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"],
    ["--tokenizer-type", "NullTokenizer", "--vocab-size", "4000",
     "--tensor-model-parallel-size", "2"],
    [*HF, "DEMO", "--make-vocab-size-divisible-by", "100"],
])
def test_the_early_vocabulary_is_the_one_megatron_builds(argv: list[str]) -> None:
    """Megatron-LM's own tokenizer builder pads the vocabulary as the preflight computed."""
    from megatron.training import global_vars
    from megatron.training.arguments import add_megatron_arguments

    argv = [str(build_demo_assets()["tokenizer"]) if a == "DEMO" else a for a in argv]
    args = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)
    args.rank = 0
    if not hasattr(args, "special_tokens"):  # megatron-core 0.19 reads it after validation
        args.special_tokens = None
    early = model_vocabulary(args)
    global_vars.build_tokenizer(args)
    assert early == args.padded_vocab_size
