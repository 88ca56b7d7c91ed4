"""Mistakes Megatron-LM or a resume would trip on after the model is built, found by the early
check (``settings_from_args`` / ``preflight.recipe_problems``) before it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from megatron_helpers import PACKED, megatron_argv, parse

from tests.kit.token_ids import token_id_recipe
from zephon.io.indexed import write_indexed_dataset
from zephon.recipe import DataRecipe
from zephon_megatron.args_checks import build_pipeline, megatron_ramps
from zephon_megatron.arguments import ZephonArgumentError, settings_from_args

TRAIN = ("--eval-interval", "10")


def check(argv: list[str], world_size: int = 1):
    return settings_from_args(parse(argv), world_size=world_size)


def problems_of(argv: list[str], world_size: int = 1) -> str:
    with pytest.raises(ZephonArgumentError) as caught:
        check(argv, world_size)
    return str(caught.value)


# -- 1. batch sizes ----------------------------------------------------------------------------
def test_a_global_batch_size_not_divisible_by_the_readers_microbatches_is_named() -> None:
    message = problems_of(megatron_argv(PACKED, "--global-batch-size", "6", mbs=4))
    assert "--global-batch-size 6 is not divisible by --micro-batch-size 4 x data-parallel " \
           "size 1 = 4" in message
    assert "--decrease-batch-size-if-needed" in message
    assert message.count("--global-batch-size 6") == 1  # reported once
    # the data-parallel size counts: 8 rows per step are not 3 readers x 2 rows
    assert "data-parallel size 3 = 6 (world size 3)" in problems_of(megatron_argv(PACKED),
                                                                     world_size=3)
    assert "data-parallel size 2 = 4 (world size 8 / 4 model-parallel ranks)" in problems_of(
        megatron_argv(PACKED, "--global-batch-size", "6", "--tensor-model-parallel-size", "4"),
        world_size=8)


def test_decreasing_the_batch_size_if_needed_is_megatrons_way_out() -> None:
    check(megatron_argv(PACKED, "--global-batch-size", "6", "--decrease-batch-size-if-needed",
                        mbs=4))
    assert "round it down to 0 microbatches" in problems_of(megatron_argv(
        PACKED, "--global-batch-size", "2", "--decrease-batch-size-if-needed", mbs=4))


@pytest.mark.skipif(not megatron_ramps(), reason="megatron-core >= 0.19 applies no batch ramp")
def test_every_batch_size_of_the_ramp_must_divide_as_megatron_checks() -> None:
    from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    argv = megatron_argv(PACKED, "--global-batch-size", "12", "--rampup-batch-size", "3", "3",
                         "100")  # 3, 6, 9, 12 rows by micro batches of 2
    message = problems_of(argv)
    assert "--rampup-batch-size 3 3 100" in message and "its start (3) is not" in message
    calculator = RampupBatchsizeNumMicroBatchesCalculator(12, 2, 1, False, 0, 3, 3, 100)
    with pytest.raises(AssertionError):  # what Megatron would raise, after the model
        calculator.update(0, consistency_check=True)
    assert "its increment (3) is not" in problems_of(megatron_argv(
        PACKED, "--global-batch-size", "10", "--rampup-batch-size", "4", "3", "100"))
    check(megatron_argv(PACKED, "--global-batch-size", "12", "--rampup-batch-size", "4", "4",
                        "100"))


# -- 2. training data that runs out ---------------------------------------------------------------
def no_repeat(tmp_path: Path) -> Path:
    path = tmp_path / "once.toml"
    path.write_text(PACKED.read_text().replace('repeat = ["demo"]', ""))
    return path


def test_text_data_estimated_short_of_the_train_iters_is_refused(tmp_path: Path) -> None:
    recipe = no_repeat(tmp_path)
    message = problems_of(megatron_argv(recipe, "--train-iters", "100000", *TRAIN))
    assert "--train-iters 100000 x the global batch size needs 800,000 samples" in message
    assert "'demo' is not repeated" in message and "about" in message
    assert 'Add repeat = ["demo"] to [mixture]' in message
    check(megatron_argv(recipe, "--train-iters", "20", *TRAIN))  # well within the data
    check(megatron_argv(PACKED, "--train-iters", "100000", *TRAIN))  # it repeats


@pytest.fixture
def indexed_recipe(tmp_path: Path) -> Path:
    return token_id_recipe(tmp_path)


def test_indexed_data_is_counted_exactly_from_its_index(indexed_recipe: Path) -> None:
    lanes = ("--zephon-lanes", "4")
    pipeline = DataRecipe.from_toml(str(indexed_recipe)).build(
        seq_len=64, microbatch_size=2, lanes=4, prefetch=0, workers=0)
    rows = 2 * sum(1 for _ in pipeline)  # what a run gets: 464 rows of 65 tokens
    fits = rows // 8  # iterations of 8 samples
    argv = megatron_argv(indexed_recipe, *lanes, "--train-iters", str(fits), *TRAIN, masking=[])
    check(argv)
    argv[argv.index(str(fits))] = str(fits + 1)
    message = problems_of(argv)
    assert f"--train-iters {fits + 1} x the global batch size needs {8 * (fits + 1)} samples" \
        in message
    assert f"yields {rows} rows" in message and "counted from the index" in message
    assert f"lower --train-iters (to {fits} iterations or fewer)" in message
    samples = ["--train-samples", str(rows + 1)]
    assert "--train-samples" in problems_of(megatron_argv(indexed_recipe, *lanes, *samples,
                                                          masking=[]))


def test_data_that_does_not_fill_one_iteration_says_so(indexed_recipe: Path) -> None:
    argv = megatron_argv(indexed_recipe, "--zephon-lanes", "4", "--train-iters", "1",
                         "--global-batch-size", "1000", *TRAIN, masking=[])
    message = problems_of(argv)
    assert "the data does not fill one iteration" in message and "--global-batch-size" in message
    assert "0 iterations" not in message


# -- 3. a resume with other lanes, seed or recipe -------------------------------------------------
def saved_run(tmp_path: Path, recipe: Path = PACKED, lanes: int = 8, mbs: int = 2) -> Path:
    from zephon.integration import rank_state
    from zephon_megatron.state_files import write_dataloader_state

    pipeline = DataRecipe.from_toml(str(recipe)).build(seq_len=64, microbatch_size=mbs,
                                                      lanes=lanes, prefetch=0, workers=0)
    iterator = iter(pipeline)
    for _ in range(3):
        next(iterator)
    ckpt = tmp_path / "ckpt"
    write_dataloader_state(ckpt, 3, 0, rank_state(pipeline.state_dict(), lanes=lanes, framework={
        "role": "train", "micro_batch_size": mbs, "consumed_samples": 3 * mbs}))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    return ckpt


def test_a_resume_with_other_lanes_is_refused_before_the_model(tmp_path: Path) -> None:
    ckpt = saved_run(tmp_path)
    check(megatron_argv(PACKED, "--load", str(ckpt)))  # the saved lanes are taken
    message = problems_of(megatron_argv(PACKED, "--load", str(ckpt), "--zephon-lanes", "4"))
    assert "was written by a different pipeline: the lane count changed (lanes: " \
           "checkpoint 8, now 4)" in message
    assert "a new --save directory" in message and message.count("lane count") == 1


def test_a_resume_with_another_seed_or_micro_batch_size_is_refused(tmp_path: Path) -> None:
    ckpt = saved_run(tmp_path)
    reseeded = tmp_path / "reseeded.toml"
    reseeded.write_text(PACKED.read_text().replace("seed = 1234", "seed = 7"))
    assert "the seed changed" in problems_of(megatron_argv(reseeded, "--load", str(ckpt)))
    message = problems_of(megatron_argv(PACKED, "--load", str(ckpt), mbs=4))
    assert "written with --micro-batch-size 2, this run has 4" in message


def test_the_early_wording_is_the_restores(tmp_path: Path) -> None:
    from zephon.errors import StateMismatchError
    from zephon.integration import read_state
    from zephon_megatron.state_files import read_dataloader_states

    ckpt = saved_run(tmp_path)
    recipe = DataRecipe.from_toml(str(PACKED))
    args = parse(megatron_argv(PACKED, "--load", str(ckpt), "--zephon-lanes", "4"))
    pipeline = build_pipeline(recipe, args, 4)
    with pytest.raises(StateMismatchError) as restored:
        pipeline.load_state_dict(read_state(read_dataloader_states(ckpt, 3), "saved").entries)
    early = problems_of(megatron_argv(PACKED, "--load", str(ckpt), "--zephon-lanes", "4"))
    assert str(restored.value).split(" Resume with")[0].split(": ", 1)[1] in early


# -- 4. Megatron's tokenizer and the token ids --------------------------------------------------
def tokenizer_copy(tmp_path: Path, name: str, **changes) -> Path:
    from zephon.text.tokenizer import load_tokenizer

    original = load_tokenizer(DataRecipe.from_toml(str(PACKED)).tokenizer)
    original.save_pretrained(tmp_path / "base")
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tmp_path / "base")
    if "added" in changes:
        copy.add_tokens(changes["added"])
    if "eos" in changes:
        copy.eos_token = changes["eos"]
    copy.save_pretrained(tmp_path / name)
    return tmp_path / name


def test_megatrons_tokenizer_with_fewer_ids_or_another_eos_is_named_early(tmp_path) -> None:
    base = tokenizer_copy(tmp_path, "same")
    bigger = tokenizer_copy(tmp_path, "bigger", added=["<x1>", "<x2>"])
    recipe = tmp_path / "bigger.toml"
    recipe.write_text(PACKED.read_text().replace('"demo:tokenizer"', f'"{bigger}"'))
    hf = ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model")
    message = problems_of(megatron_argv(recipe, *hf, str(base)))
    assert f"--tokenizer-model '{base}' has 4096 ids, the recipe's tokenizer" in message
    assert "4098" in message
    check(megatron_argv(PACKED, *hf, str(base)))  # the same tokenizer
    other_eos = tokenizer_copy(tmp_path, "other_eos", eos="<|bos|>")
    message = problems_of(megatron_argv(PACKED, *hf, str(other_eos)))
    assert "ends documents with id 1" in message and "with 2" in message


def test_token_ids_above_the_vocab_size_are_found_in_the_data(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "ids_text_document",
                                   [np.arange(1, 300) % 250 + (i == 7) * 900
                                    for i in range(20)])
    argv = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--calculate-per-token-loss", "--transformer-impl", "local", "--eval-iters", "0",
            "--dataloader", "zephon", "--data-path", prefix, "--split", "1,0,0",
            "--zephon-lanes", "2"]
    message = problems_of([*argv, "--vocab-size", "512"])
    assert f"{prefix}: holds token id 1149, but --vocab-size is 512" in message
    check([*argv, "--vocab-size", "2048"])
    small = write_indexed_dataset(tmp_path / "small_text_document",
                                  [np.arange(1, 300) for _ in range(20)], dtype=np.uint16)
    argv[argv.index(prefix)] = small
    check([*argv, "--vocab-size", "65536"])  # uint16 ids: nothing to read


# -- 5. one copy of an early error ----------------------------------------------------------------
def test_only_global_rank_0_prints_the_early_error(monkeypatch, capsys) -> None:
    from zephon_megatron import pretrain_gpt

    argv = megatron_argv(PACKED, "--global-batch-size", "6", mbs=4)
    monkeypatch.setenv("RANK", "1")
    assert pretrain_gpt.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert pretrain_gpt.main(argv) == 2
    assert capsys.readouterr().err.count("--global-batch-size 6 is not divisible") == 1


# -- 6. small ones -------------------------------------------------------------------------------
def test_cpu_runs_turn_off_the_fused_rope_kernel() -> None:
    import importlib.util

    from zephon_megatron_tools.cpu_pretrain import CPU_FLAGS

    assert "--no-rope-fusion" in CPU_FLAGS
    if importlib.util.find_spec("megatron.training") is not None:  # Megatron-LM knows it
        from test_megatron_arguments import _megatron_parser

        args, _ = _megatron_parser().parse_known_args(["--no-rope-fusion"])
        assert args.apply_rope_fusion is False


def test_the_missing_megatron_lm_message_follows_the_installed_version() -> None:
    from zephon_megatron.pretrain_gpt import (
        megatron_core_version,
        megatron_lm_advice,
        missing_message,
    )

    old = megatron_lm_advice(["megatron.training"], "0.16.1")
    assert "megatron-core 0.16.1 ships only megatron.core" in old and "core_v0.16.1" in old
    new = megatron_lm_advice(["gpt_builders", "model_provider"], "0.19.2")
    assert "ships megatron.training, but not gpt_builders, model_provider" in new
    assert "core_v0.19.2" in new and "only megatron.core" not in new
    installed = megatron_core_version()
    assert installed and f"core_v{installed}" in missing_message(["pretrain_gpt"])


def test_a_missing_training_dependency_is_named(monkeypatch, capsys) -> None:
    import builtins

    from zephon_megatron import pretrain_gpt

    real_import = builtins.__import__

    def without_six(name, *args, **kwargs):
        if name == "megatron.training":
            raise ModuleNotFoundError("No module named 'six'", name="six")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(pretrain_gpt, "missing_megatron_lm", lambda dataloader="zephon": [])
    monkeypatch.setattr(builtins, "__import__", without_six)
    assert pretrain_gpt.main(megatron_argv(PACKED)) == 2
    err = capsys.readouterr().err
    assert "megatron.training imports 'six', which is not installed" in err
    assert 'pip install "zephon[megatron-training]"' in err


# -- 7. --data-path runs: the tokenizer and the EOD ----------------------------------------------
def data_path_argv(prefix: str, *extra: str) -> list[str]:
    return ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--calculate-per-token-loss", "--transformer-impl", "local", "--eval-iters", "0",
            "--dataloader", "zephon", "--data-path", prefix, "--split", "1,0,0",
            "--zephon-lanes", "2", *extra]


@pytest.fixture
def ends_with(tmp_path: Path):
    """An indexed dataset whose documents end with the given EOD id."""
    def write(eod: int) -> str:
        rng = np.random.default_rng(eod)
        return write_indexed_dataset(tmp_path / f"eod{eod}_text_document", [
            np.append(rng.integers(5, 900, size=int(rng.integers(10, 90))), eod)
            for _ in range(200)])
    return write


def entry_error(monkeypatch, capsys, argv: list[str]) -> str:
    """What the entry prints, before Megatron-LM is imported, on rank 0 (and on rank 1:
    nothing), both exiting with status 2."""
    from zephon_megatron import pretrain_gpt

    monkeypatch.setenv("RANK", "1")
    assert pretrain_gpt.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert pretrain_gpt.main(argv) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("tokenizer", [["--tokenizer-type", "NullTokenizer", "--vocab-size",
                                        "4096"], ["--vocab-size", "4096"]])
def test_a_null_tokenizers_eod_is_refused_for_eod_mask_loss_before_megatron(
        ends_with, monkeypatch, capsys, tokenizer: list[str]) -> None:
    argv = data_path_argv(ends_with(2), *tokenizer, "--eod-mask-loss")
    err = entry_error(monkeypatch, capsys, argv)
    assert err.count("NullTokenizer is made up from --vocab-size") == 1
    assert "Traceback" not in err
    check(data_path_argv(ends_with(2), *tokenizer))  # without --eod-mask-loss: fine


def test_documents_ending_with_another_eod_are_refused_for_eod_mask_loss(ends_with) -> None:
    from zephon.demo.assets import build_demo_assets

    model = str(build_demo_assets()["tokenizer"])  # its EOS is 2
    hf = ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model)
    zero = ends_with(0)
    message = problems_of(data_path_argv(zero, *hf, "--eod-mask-loss"))
    assert f"{zero}: --eod-mask-loss masks the label after EOD id 2" in message
    assert "they end with 0 (200 of 200)" in message
    check(data_path_argv(ends_with(2), *hf, "--eod-mask-loss"))  # the tokenizer's EOD
    check(data_path_argv(zero, *hf))  # no mask: nothing to check


def test_token_ids_without_a_tokenizer_or_vocab_size_are_refused_before_megatron(
        ends_with, monkeypatch, capsys) -> None:
    err = entry_error(monkeypatch, capsys, data_path_argv(ends_with(2)))
    assert "names neither the tokenizer they were written with nor a vocabulary size" in err
    assert "--vocab-size N" in err and "Traceback" not in err


def test_the_preflight_follows_ckpt_step(tmp_path: Path) -> None:
    """The resume reads --ckpt-step's loader state, not the latest one: a later checkpoint
    written with other lanes does not refuse a resume from the earlier one."""
    from zephon.integration import rank_state
    from zephon_megatron.state_files import write_dataloader_state

    ckpt = saved_run(tmp_path)  # iteration 3, 8 lanes
    write_dataloader_state(ckpt, 5, 0, rank_state({}, lanes=4, framework={"micro_batch_size": 4}))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("5")
    argv = megatron_argv(PACKED, "--load", str(ckpt), "--zephon-lanes", "8")
    assert "written with --micro-batch-size 4" in problems_of(argv)
    check([*argv, "--ckpt-step", "3"])
    check([*argv, "--finetune"])  # Megatron starts over: no loader state is read
