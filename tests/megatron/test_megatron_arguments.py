"""The argument layer: the adapter's parser always, Megatron-LM's where a checkout is present."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
from megatron_helpers import CONTINUOUS, PACKED, PACKED_FLAGS, VALIDATION, megatron_argv, parse

from zephon.errors import ConfigError
from zephon_megatron.arguments import (
    ZephonArgumentError,
    add_megatron_data_flags,
    add_zephon_args,
    make_extra_args_provider,
    settings_from_args,
)


def settings(argv: list[str]):
    return settings_from_args(parse(argv))


def test_megatron_stays_the_default_dataloader() -> None:
    args = parse(["--seq-length", "8"])
    assert args.dataloader == "megatron"
    assert args.zephon_recipe is None and args.dataloader_save is None


def test_unknown_dataloader_is_rejected() -> None:
    with pytest.raises(SystemExit):
        parse(["--dataloader", "webdataset"])


def test_packed_recipe_with_its_flags() -> None:
    s = settings(megatron_argv(PACKED, "--zephon-valid-recipe", str(VALIDATION)))
    assert (s.masking.position_mode, s.masking.document_masking, s.masking.eos_mask_loss) == (
        "preserve", True, True)
    assert s.seq_length == 64 and s.micro_batch_size == 2 and s.lanes == 8
    assert s.attention == "dense"
    assert s.valid_recipe == str(VALIDATION)


def test_continuous_recipe_without_flags() -> None:
    s = settings(megatron_argv(CONTINUOUS, masking=[]))
    assert (s.masking.position_mode, s.masking.document_masking, s.masking.eos_mask_loss) == (
        "sequence", False, False)


def test_transformer_engine_selects_thd() -> None:
    argv = megatron_argv(PACKED)
    argv[argv.index("local")] = "transformer_engine"
    assert settings(argv).attention == "thd"


@pytest.mark.parametrize("flag,key", [("--reset-position-ids", "position_mode"),
                                      ("--reset-attention-mask", "return_cu_seqlens"),
                                      ("--eod-mask-loss", "eos_mask_loss")])
def test_a_missing_flag_conflicts_with_the_packed_recipe(flag: str, key: str) -> None:
    masking = [f for f in PACKED_FLAGS if f != flag]
    with pytest.raises(ZephonArgumentError) as err:
        settings(megatron_argv(PACKED, masking=masking))
    message = str(err.value)
    assert flag in message and key in message and "pretrain_packed.toml" in message
    assert "absent" in message


@pytest.mark.parametrize("flag", PACKED_FLAGS)
def test_an_extra_flag_conflicts_with_the_continuous_recipe(flag: str) -> None:
    with pytest.raises(ZephonArgumentError, match=flag):
        settings(megatron_argv(CONTINUOUS, masking=[flag]))


def test_an_open_recipe_takes_the_flags(tmp_path: Path) -> None:
    recipe = tmp_path / "open.toml"
    recipe.write_text("lanes = 4\n" + VALIDATION.read_text())
    s = settings(megatron_argv(recipe, masking=["--eod-mask-loss"]))
    assert (s.masking.position_mode, s.masking.document_masking, s.masking.eos_mask_loss) == (
        "sequence", False, True)


@pytest.mark.parametrize("extra,needle", [
    (["--data-path", "/data/x"], "--data-path"),
    (["--mock-data"], "--mock-data"),
    (["--dataloader-type", "single"], "--dataloader-type"),
    (["--zephon-lanes", "0"], "--zephon-lanes must be >= 1"),
    (["--context-parallel-size", "2"], "--context-parallel-size"),
    (["--full-validation"], "--full-validation"),
    (["--transformer-impl", "inference_optimized"], "--transformer-impl"),
    (["--num-workers", "-1"], "--num-workers must be >= 0"),
    (["--data-cache-path", "/cache"], "--data-cache-path names Megatron's index cache"),
    (["--eval-iters", "10"], "--eval-iters 10 plans evaluation, but there is no "
                             "--zephon-valid-recipe"),
    (["--train-iters", "10"], "--train-iters needs --eval-interval"),
    (["--zephon-test-recipe", "/no/such.toml"], "--zephon-test-recipe '/no/such.toml'"),
])
def test_conflicting_flags_are_named(extra: list[str], needle: str) -> None:
    with pytest.raises(ZephonArgumentError, match=needle):
        settings(megatron_argv(PACKED, *extra))


def test_required_flags_are_named() -> None:
    argv = megatron_argv(PACKED)
    without_loss_flag = [a for a in argv if a != "--calculate-per-token-loss"]
    with pytest.raises(ZephonArgumentError, match="--calculate-per-token-loss"):
        settings(without_loss_flag)
    cut = argv.index("--seq-length")
    with pytest.raises(ZephonArgumentError, match="--seq-length"):
        settings(argv[:cut] + argv[cut + 2:])
    cut = argv.index("--zephon-recipe")
    with pytest.raises(ZephonArgumentError, match="--zephon-recipe"):
        settings(argv[:cut] + argv[cut + 2:])


def test_megatron_0_19_document_masking_flag_means_reset_attention_mask() -> None:
    argv = megatron_argv(PACKED, masking=["--reset-position-ids", "--eod-mask-loss",
                                          "--dataloader-inter-document-masking"])
    assert settings(argv).masking.document_masking


def test_num_workers_keeps_its_megatron_meaning() -> None:
    assert settings(megatron_argv(PACKED, "--num-workers", "2")).workers == 2
    assert settings(megatron_argv(PACKED)).workers is None  # the recipe decides (0)


def test_loader_state_goes_into_the_checkpoint_without_dataloader_save() -> None:
    run = settings(megatron_argv(PACKED, "--save", "ckpt", "--load", "old"))
    assert (run.dataloader_save, run.dataloader_load) == ("ckpt", "old")
    run = settings(megatron_argv(PACKED, "--save", "ckpt", "--dataloader-save", "data"))
    assert (run.dataloader_save, run.dataloader_load) == ("data", "data")
    assert settings(megatron_argv(PACKED)).dataloader_save is None


def test_zephon_flags_need_the_zephon_dataloader() -> None:
    with pytest.raises(ZephonArgumentError, match="--zephon-recipe is only read with"):
        settings(["--zephon-recipe", str(PACKED), "--seq-length", "64"])


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(ZephonArgumentError, match="no such file"):
        settings(megatron_argv(tmp_path / "nope.toml"))


@pytest.mark.parametrize("head,tail,needle", [
    ("colour = 'blue'\n", "", "colour"),
    ("", "\n[batch]\nmicrobatch_size = 8\n", "microbatch_size"),
    ("", "\n[batch]\ndrop_last = false\n", "drop_last"),
])
def test_bad_recipes_fail_naming_the_key(tmp_path: Path, head: str, tail: str,
                                         needle: str) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(head + PACKED.read_text() + tail)
    with pytest.raises(ConfigError) as err:
        settings(megatron_argv(path))
    assert needle in str(err.value) and str(path) in str(err.value)


def test_pack_length_must_match_seq_length(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(PACKED.read_text().replace('algorithm = "wrap"',
                                               'algorithm = "wrap"\nmax_length = 129'))
    with pytest.raises(ZephonArgumentError, match="max_length"):
        settings(megatron_argv(path, seq=64))
    assert settings(megatron_argv(path, seq=128)).seq_length == 128


@pytest.mark.parametrize("line,needle", [("flatten = true", "flatten"),
                                         ("return_padding_mask = true", "return_padding_mask"),
                                         ("rename_fields = { labels = 'target' }",
                                          "rename_fields")])
def test_layout_options_are_fixed_by_the_adapter(tmp_path: Path, line: str,
                                                 needle: str) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(PACKED.read_text() + line + "\n")
    with pytest.raises(ConfigError, match=needle):
        settings(megatron_argv(path))


def test_a_recipe_may_leave_out_what_the_megatron_preset_fixes(tmp_path: Path) -> None:
    """return_labels and return_loss_mask are the preset's: a recipe without them still
    masks EOS labels (which needs labels), and one that contradicts them names Megatron."""
    lean = tmp_path / "lean.toml"
    lean.write_text(PACKED.read_text().replace("return_labels = true", "")
                    .replace("return_loss_mask = true", ""))
    assert "return_labels" not in lean.read_text()
    assert settings(megatron_argv(lean)).masking.eos_mask_loss
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(lean.read_text() + "return_loss_mask = false\n")
    with pytest.raises(ConfigError, match="return_loss_mask = False conflicts with Megatron, "
                                          "which needs True"):
        settings(megatron_argv(wrong))


def test_lanes_default_to_eight_per_reader_of_the_first_launch(tmp_path: Path) -> None:
    path = PACKED  # sets no lanes
    argv = megatron_argv(path, "--tensor-model-parallel-size", "2", "--global-batch-size", "24")
    assert settings_from_args(parse(argv), world_size=24).lanes == 96  # 12 readers
    assert settings_from_args(parse(argv), world_size=2).lanes == 8
    assert settings(megatron_argv(path, "--zephon-lanes", "4")).lanes == 4


def test_lanes_the_readers_cannot_share_are_named_where_they_came_from() -> None:
    with pytest.raises(ZephonArgumentError) as flag:
        settings_from_args(parse(megatron_argv(PACKED, "--zephon-lanes", "3")), world_size=2)
    assert "--zephon-lanes 3: 3 lanes cannot be shared by 2" in str(flag.value)
    assert "lanes = 3" not in str(flag.value)


def test_recipe_lanes_and_the_flag_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text("lanes = 8\n" + PACKED.read_text())
    with pytest.raises(ZephonArgumentError, match="lanes = 8 conflicts with --zephon-lanes 4"):
        settings(megatron_argv(path, "--zephon-lanes", "4"))


def test_a_resume_keeps_the_lanes_of_its_loader_state(tmp_path: Path) -> None:
    from zephon.integration import rank_state
    from zephon_megatron.state_files import write_dataloader_state

    path = PACKED
    ckpt = tmp_path / "ckpt"
    write_dataloader_state(ckpt, 6, 0, rank_state({}, lanes=96))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("6")
    argv = megatron_argv(path, "--load", str(ckpt))
    assert settings_from_args(parse(argv), world_size=4).lanes == 96
    with pytest.raises(ZephonArgumentError,
                       match=r"96 lanes cannot be shared by 5 .*\[1, 2, 3, 4, 6, 8, 12, 16, 24"):
        settings_from_args(parse(argv), world_size=5)


def test_extra_args_provider_defaults_to_the_external_dataloader_type() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_data_flags(parser)
    make_extra_args_provider("zephon")(parser)
    assert parser.parse_args(["--dataloader", "zephon"]).dataloader_type == "external"
    plain = make_extra_args_provider("megatron")(add_megatron_data_flags(
        argparse.ArgumentParser(allow_abbrev=False)))
    assert plain.parse_args([]).dataloader_type is None


def test_dataloader_save_is_not_added_twice() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--dataloader-save", default="x")
    add_zephon_args(parser)
    assert parser.parse_args([]).dataloader_save == "x"


def test_smoke_refuses_conflicting_flags_before_starting(tmp_path: Path, capsys) -> None:
    from zephon_megatron_tools import smoke

    argv = ["--workdir", str(tmp_path), "--", *megatron_argv(PACKED, masking=[])]
    assert smoke.main(argv) == 2
    assert "--reset-position-ids" in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "no process started"


# -- against Megatron-LM's own parser (needs a Megatron-LM checkout on PYTHONPATH) ------------
megatron_lm = pytest.mark.skipif(
    importlib.util.find_spec("megatron.training") is None,
    reason="Megatron-LM (megatron.training) is not on PYTHONPATH")


def _megatron_parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    return add_megatron_arguments(parser)


NEWER_THAN_0_16 = {"--dataloader-inter-document-masking", "--null-tokenizer-eod-id",
                   "--no-pad-vocab-size", "--override-ckpt-iteration"}


@megatron_lm
def test_subset_flags_mean_the_same_in_megatron() -> None:
    theirs = _megatron_parser()._option_string_actions
    ours = add_megatron_data_flags(argparse.ArgumentParser())._option_string_actions
    for option, action in ours.items():
        if option in ("-h", "--help"):
            continue
        if option in NEWER_THAN_0_16 and option not in theirs:
            continue
        assert option in theirs, f"Megatron-LM has no {option}"
        assert theirs[option].dest == action.dest, option
        assert theirs[option].default == action.default, option
        assert theirs[option].nargs == action.nargs, option
        assert list(theirs[option].choices or []) == list(action.choices or []), option


@megatron_lm
def test_megatron_parser_accepts_the_adapter_flags() -> None:
    parser = make_extra_args_provider("zephon")(_megatron_parser())
    args = parser.parse_args(megatron_argv(PACKED))
    assert args.dataloader_type == "external" and args.num_workers is None
    assert settings_from_args(args).masking.document_masking


@megatron_lm
def test_megatron_validate_args_keeps_the_adapter_choices(monkeypatch) -> None:
    from megatron.training.arguments import parse_args, validate_args

    from zephon_megatron.pretrain_gpt import zephon_args_defaults

    argv = [*megatron_argv(PACKED), "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--max-position-embeddings", "64",
            "--train-iters", "3", "--eval-interval", "3", "--lr", "1e-3"]
    monkeypatch.setattr("sys.argv", ["pretrain_gpt", *argv])
    args = parse_args(make_extra_args_provider("zephon"))
    validate_args(args, zephon_args_defaults(settings_from_args(args), argv))
    assert args.dataloader_type == "external"
    assert args.tokenizer_type == "NullTokenizer" and args.vocab_size == 4096
    assert settings_from_args(args).masking.eos_mask_loss
