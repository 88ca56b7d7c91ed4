"""Provider and iterators: the Megatron preset, save/restore, elastic resume, counter checks."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from megatron.core.rerun_state_machine import (
    RerunDataIterator,
    RerunMode,
    destroy_rerun_state_machine,
    initialize_rerun_state_machine,
)
from megatron_helpers import PACKED, VALIDATION, megatron_argv, parse

from zephon.errors import ConfigError, StateMismatchError
from zephon.recipe import DataRecipe
from zephon_megatron.arguments import ZephonArgumentError, settings_from_args
from zephon_megatron.provider import (
    Topology,
    ZephonDatasetsProvider,
    build_iterator,
    restore_for_resume,
)
from zephon_megatron.state_files import (
    dataloader_state_path,
    read_dataloader_states,
    write_dataloader_state,
)


def make_args(*extra: str) -> argparse.Namespace:
    return parse(megatron_argv(PACKED, "--zephon-prefetch", "0", *extra))


def iterator(rank: int = 0, world: int = 1, *extra: str):
    settings = settings_from_args(make_args(*extra))
    return build_iterator(DataRecipe.from_toml(PACKED), settings, Topology(rank, world))


def tokens(batches: list[dict[str, torch.Tensor]]) -> list[list[list[int]]]:
    return [b["tokens"].tolist() for b in batches]


def take(it, n: int) -> list[dict[str, torch.Tensor]]:
    return [next(it) for _ in range(n)]


def test_iterator_yields_the_megatron_preset() -> None:
    batch = next(iterator())
    assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens",
                          "max_seqlen"}
    for name in ("tokens", "labels", "position_ids"):
        assert batch[name].dtype == torch.int64 and batch[name].shape == (2, 64)
    assert batch["loss_mask"].dtype == torch.float32
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"].shape[0] == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_microbatches_megatron_keeps_for_a_rerun_stay_as_they_were(workers: int) -> None:
    """Megatron's ``RerunDataIterator`` holds every microbatch of an iteration (shallow, for a
    replay) while the loader reads ahead: no buffer behind them may be reused."""
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)
    try:
        rerun = RerunDataIterator(iterator(0, 1, "--zephon-prefetch", "8",
                                           "--num-workers", str(workers)))
        for _ in range(3):
            held = take(rerun, 4)
            copies = [{k: v.clone() for k, v in b.items()} for b in held]
            time.sleep(0.3)  # the read-ahead fills meanwhile
            rerun.rewind()
            for batch, copy in zip(take(rerun, 4), copies, strict=True):
                assert all(torch.equal(batch[k], copy[k]) for k in copy)
            rerun.advance()
    finally:
        destroy_rerun_state_machine()


def test_save_and_restore_continue_exactly() -> None:
    first = iterator()
    take(first, 5)
    state = first.save_state()
    assert state["framework"]["consumed_samples"] == 10 and set(state["entries"]) == {
        f"lane_{lane}" for lane in range(8)}
    expected = take(first, 4)
    second = iterator()
    second.restore_state(state)
    assert second.consumed_samples == 10
    assert tokens(take(second, 4)) == tokens(expected)


def test_states_of_two_ranks_resume_at_one(tmp_path: Path) -> None:
    ranks = [iterator(r, 2) for r in range(2)]
    for it in ranks:
        take(it, 3)  # 6 global microbatches
    for r, it in enumerate(ranks):
        write_dataloader_state(tmp_path, 6, r, it.save_state())
    assert dataloader_state_path(tmp_path, 6, 1).is_file()
    following: dict[int, list[list[int]]] = {}
    for it in ranks:
        for _ in range(3):
            data = next(it)
            following[it.last_global_microbatch] = data["tokens"].tolist()
    resumed = iterator()
    restore_for_resume(resumed, settings_from_args(make_args("--dataloader-save",
                                                             str(tmp_path))), 6, 12)
    for _ in range(6):
        data = next(resumed)
        assert data["tokens"].tolist() == following[resumed.last_global_microbatch]
    assert sorted(following) == list(range(6, 12))


def test_one_rank_state_is_not_enough_at_another_size(tmp_path: Path) -> None:
    ranks = [iterator(r, 2) for r in range(2)]
    for it in ranks:
        take(it, 1)
    write_dataloader_state(tmp_path, 1, 0, ranks[0].save_state())
    with pytest.raises(StateMismatchError, match="lane_1"):
        iterator().restore_state(read_dataloader_states(tmp_path, 1))


def test_states_that_disagree_on_a_lane_are_refused() -> None:
    """A stale file of another step among a checkpoint's: its lanes differ from the rest."""
    it = iterator()
    take(it, 2)
    early = it.save_state()
    take(it, 2)
    late = it.save_state()
    with pytest.raises(StateMismatchError, match="different entries for 'lane_0'"):
        iterator().restore_state([late, early])
    iterator().restore_state([late, late])  # the same lanes twice (tensor-parallel peers)


def test_consumed_samples_must_match_the_checkpoint(tmp_path: Path) -> None:
    it = iterator()
    take(it, 4)
    write_dataloader_state(tmp_path, 2, 0, it.save_state())
    settings = settings_from_args(make_args("--dataloader-save", str(tmp_path)))
    with pytest.raises(StateMismatchError, match="consumed_train_samples is 16"):
        restore_for_resume(iterator(), settings, 2, 16)
    restore_for_resume(iterator(), settings, 2, 8)


def test_resume_without_loader_state_is_an_error(tmp_path: Path) -> None:
    settings = settings_from_args(make_args())
    with pytest.raises(ZephonArgumentError, match="--dataloader-save"):
        restore_for_resume(iterator(), settings, 3, 24)
    settings = settings_from_args(make_args("--dataloader-save", str(tmp_path)))
    with pytest.raises(StateMismatchError, match="iter_0000003"):
        restore_for_resume(iterator(), settings, 3, 24)
    restore_for_resume(iterator(), settings, 0, 0)  # a fresh run reads nothing


def test_micro_batch_size_change_is_named() -> None:
    it = iterator()
    take(it, 1)
    state = it.save_state()
    settings = settings_from_args(parse(megatron_argv(PACKED, mbs=4)))
    other = build_iterator(DataRecipe.from_toml(PACKED), settings, Topology())
    with pytest.raises(StateMismatchError, match="--micro-batch-size 2"):
        other.restore_state(state)


def test_dp_size_must_divide_lanes() -> None:
    with pytest.raises(ZephonArgumentError, match=r"8 lanes cannot be shared by .*\[1, 2, 4, 8\]"):
        iterator(0, 3)


def test_provider_builds_train_valid_test_and_repeats_validation(tmp_path: Path) -> None:
    test_recipe = tmp_path / "test.toml"
    test_recipe.write_text(VALIDATION.read_text().replace("seed = 0", "seed = 7")
                           + "\n[shuffle]\nbuffer_size = 16\n")
    args = make_args("--zephon-valid-recipe", str(VALIDATION), "--eval-iters", "2",
                     "--zephon-test-recipe", str(test_recipe))
    train, valid, test = ZephonDatasetsProvider(lambda: args, lambda: Topology())([0, 0, 0])
    assert train.role == "train" and valid.role == "valid" and test.role == "test"
    window = 2 * args.global_batch_size // args.micro_batch_size
    assert valid.restart_every == window
    first = tokens(take(valid, window))
    assert tokens(take(valid, window)) == first, "every evaluation scores the same data"
    assert test.source.endswith("test.toml") and tokens(take(test, window)) != first
    args = make_args("--zephon-valid-recipe", str(VALIDATION), "--eval-iters", "2")
    assert ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)[2] is None, \
        "no test recipe: no test iterator, so Megatron plans no test"


def test_provider_restores_and_checks_megatron_counters(tmp_path: Path) -> None:
    it = iterator()
    take(it, 8)
    write_dataloader_state(tmp_path, 2, 0, it.save_state())
    expected = next(it)["tokens"]
    args = make_args("--dataloader-save", str(tmp_path))
    args.iteration, args.consumed_train_samples = 2, 16
    train, valid, test = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    assert valid is None and test is None
    assert torch.equal(next(train)["tokens"], expected)
    args.consumed_train_samples = 24
    with pytest.raises(StateMismatchError, match="consumed"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)


def test_provider_checks_the_model_vocabulary() -> None:
    args = make_args()
    args.padded_vocab_size = 1024
    with pytest.raises(ZephonArgumentError, match="4096 tokens"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)


def test_a_validation_recipe_too_small_for_one_evaluation_is_refused_before_training(
        tmp_path: Path) -> None:
    import json

    from zephon.demo.assets import make_documents

    (tmp_path / "held_out.jsonl").write_text("".join(
        json.dumps({"text": t}) + "\n" for t in make_documents(30, seed=3)))
    small = tmp_path / "small.toml"
    small.write_text(VALIDATION.read_text().replace('path = "demo:corpus"',
                                                    f'path = "{tmp_path / "held_out.jsonl"}"'))
    args = make_args("--zephon-valid-recipe", str(small), "--eval-iters", "50")
    with pytest.raises(ConfigError, match=r"small.toml: the valid data ends after \d+ "
                                          r"microbatches on this reader, but one evaluation "
                                          r"reads 200"):
        ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)


def test_evaluation_windows_are_the_same_after_a_resume(tmp_path: Path) -> None:
    """Evaluations before a checkpoint and after the resume (at another data-parallel size)
    score the same microbatches: validation restarts every window and is not checkpointed."""
    valid = ("--zephon-valid-recipe", str(VALIDATION), "--eval-iters", "1")
    args = make_args(*valid, "--save", str(tmp_path))
    train, first, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    take(train, 8)
    before = tokens(take(first, 4))
    write_dataloader_state(tmp_path, 2, 0, train.save_state())
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    windows = []
    for rank in (0, 1):  # resumed at data-parallel size 2
        resumed = make_args(*valid, "--load", str(tmp_path))
        resumed.iteration, resumed.consumed_train_samples = 2, 16
        _, again, _ = ZephonDatasetsProvider(lambda r=resumed: r,
                                             lambda rank=rank: Topology(rank, 2))(None)
        windows.append([b.tokens for b in map(_Rows, take(again, 2))])
    assert sorted(row for w in windows for batch in w for row in batch) == sorted(
        row for batch in before for row in batch)


class _Rows:
    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.tokens = batch["tokens"].tolist()


def test_without_dataloader_save_the_state_lives_in_the_checkpoint(tmp_path: Path) -> None:
    args = make_args("--save", str(tmp_path / "ckpt"))
    train, _, _ = ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)
    assert args.dataloader_save == str(tmp_path / "ckpt"), "Megatron's hook writes it there"
    take(train, 8)
    write_dataloader_state(args.dataloader_save, 2, 0, train.save_state())
    expected = next(train)["tokens"]
    resumed = make_args("--load", str(tmp_path / "ckpt"))
    resumed.iteration, resumed.consumed_train_samples = 2, 16
    again, _, _ = ZephonDatasetsProvider(lambda: resumed, lambda: Topology())(None)
    assert torch.equal(next(again)["tokens"], expected)
    lost = make_args()
    lost.iteration, lost.consumed_train_samples = 2, 16
    with pytest.raises(ZephonArgumentError, match="pass --load"):
        ZephonDatasetsProvider(lambda: lost, lambda: Topology())(None)


@pytest.mark.parametrize("masking", [False, True])
def test_middle_pipeline_stages_build_a_pipeline_only_for_document_boundaries(
        masking: bool) -> None:
    from megatron_helpers import CONTINUOUS

    asked: list[tuple[int | None, bool]] = []

    def middle_stage(vp_stage: int | None, document_masking: bool) -> bool:
        asked.append((vp_stage, document_masking))
        return document_masking  # what compat.stage_reads answers on a middle stage

    argv = megatron_argv(PACKED) if masking else megatron_argv(CONTINUOUS, masking=[])
    args = parse([*argv, "--zephon-prefetch", "0"])
    built = ZephonDatasetsProvider(lambda: args, lambda: Topology(), middle_stage)(None, 1)
    assert asked == [(1, masking)]
    if masking:
        assert "cu_seqlens" in next(built[0])
    else:
        assert built == (None, None, None)


def test_num_workers_changes_nothing_in_the_microbatches() -> None:
    plain = tokens(take(iterator(), 6))
    with_workers = iterator(0, 1, "--num-workers", "2")
    assert with_workers.pipeline._options.workers == 2
    assert tokens(take(with_workers, 6)) == plain


def test_the_end_of_run_report_is_printed_once_when_the_data_ends(tmp_path: Path, capsys):
    """Out of data, the training iterator of rank 0 prints the report at once; the exit hook
    then prints nothing more."""
    import gc
    import json

    from zephon.demo.assets import make_documents

    gc.collect()  # earlier tests' iterators report as they are collected: not in this output
    capsys.readouterr()

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_text("".join(
        json.dumps({"text": t}) + "\n" for t in make_documents(12, seed=2)))
    recipe = tmp_path / "small.toml"
    recipe.write_text(PACKED.read_text().replace('path = "demo:corpus"',
                                                 f'path = "{tmp_path / "docs"}"')
                      .replace('repeat = ["demo"]', "repeat = false"))
    settings = settings_from_args(parse(megatron_argv(recipe, "--zephon-prefetch", "0",
                                                      "--zephon-lanes", "1")))
    reader = build_iterator(DataRecipe.from_toml(recipe), settings, Topology(0, 1))
    with pytest.raises(StopIteration):
        while True:
            next(reader)
    reader.summarize("at exit")  # what the exit hook runs: the report was printed already
    printed = capsys.readouterr().out
    assert printed.count("zephon: end of run") == 1 and "(end of data)" in printed
    assert "handed to the trainer" in printed


RAMP = ("--log-interval", "1", "--rampup-batch-size", "2", "2", "24")
needs_ramp = pytest.mark.skipif(
    not hasattr(__import__("megatron.core.num_microbatches_calculator", fromlist=["_"]),
                "RampupBatchsizeNumMicroBatchesCalculator"),
    reason="megatron-core >= 0.19 has no batch size ramp (--rampup-batch-size is deprecated)")


def megatron_iterations(microbatches: int) -> dict[int, int]:
    """{microbatches handed out: iteration completed} through megatron-core's own global
    calculator, as Megatron's training loop steps it (update, read, add the samples)."""
    from megatron.core import num_microbatches_calculator as calculator

    calculator.init_num_microbatches_calculator(
        rank=0, rampup_batch_size=[2, 2, 24], global_batch_size=8, micro_batch_size=2,
        data_parallel_size=1, decrease_batch_size_if_needed=False)
    try:
        ends, handed, iteration, consumed = {}, 0, 0, 0
        while handed < microbatches:
            calculator.update_num_microbatches(consumed, consistency_check=True)
            handed += calculator.get_num_microbatches()
            consumed += calculator.get_num_microbatches() * 2
            iteration += 1
            if handed <= microbatches:
                ends[handed] = iteration
        return ends
    finally:
        calculator.destroy_num_microbatches_calculator()


def logged_iterations(it, microbatches: int, monkeypatch) -> dict[int, int]:
    """{microbatches handed out: iteration} of the metrics the iterator writes."""
    from zephon_megatron import step_metrics as metrics

    steps: list[int] = []
    writer = type("Writer", (), {"add_scalar": lambda self, tag, value, step: steps.append(
        step) if tag == "zephon/tokens_per_s" else None})()
    monkeypatch.setitem(metrics._WRITERS, "tensorboard", writer)
    logged = {}
    for handed in range(1, microbatches + 1):
        next(it)
        if steps:
            logged[handed] = steps.pop()
    return logged


@needs_ramp
def test_iterations_follow_megatrons_batch_size_ramp(monkeypatch) -> None:
    """--rampup-batch-size: one microbatch per step at first, then 2, 3 and 4 (global batch
    2, 4, 6, 8): the metrics' iterations are Megatron's, and the data is the same."""
    ramped = iterator(0, 1, *RAMP)
    assert logged_iterations(ramped, 24, monkeypatch) == megatron_iterations(24)
    plain = iterator()
    fresh = iterator(0, 1, *RAMP)
    assert tokens(take(fresh, 24)) == tokens(take(plain, 24))


@needs_ramp
def test_a_resume_inside_the_ramp_keeps_megatrons_iterations(monkeypatch) -> None:
    first = iterator(0, 1, *RAMP)
    take(first, 11)  # 7 iterations: 4 of one microbatch, 2 of two, 1 of three
    state = first.save_state()
    assert state["framework"]["consumed_samples"] == 22
    resumed = iterator(0, 1, *RAMP)
    resumed.restore_state(state)
    expected = {handed - 11: iteration for handed, iteration in megatron_iterations(30).items()
                if handed > 11}
    assert logged_iterations(resumed, 19, monkeypatch) == expected


@pytest.mark.parametrize("ramp, message", [
    (["2", "x", "24"], "three integers"),
    (["4", "3", "10"], "does not reach --global-batch-size 8"),
])
def test_a_bad_ramp_is_named(ramp: list[str], message: str) -> None:
    with pytest.raises(ZephonArgumentError, match=message):
        settings_from_args(make_args("--rampup-batch-size", *ramp))


def test_a_megatron_tokenizer_with_another_eos_is_an_error(monkeypatch) -> None:
    """--tokenizer-model whose EOS is not the recipe tokenizer's: different tokenizers."""
    from zephon.text.tokenizer import resolve_encoder
    from zephon_megatron import provider

    recipe_eos = resolve_encoder(DataRecipe.from_toml(PACKED).tokenizer, None).special.eos
    args = make_args()
    args.tokenizer_model = "/models/other"
    for eod, fails in ((recipe_eos + 1, True), (recipe_eos, False)):
        tokenizer = type("HuggingFaceTokenizer", (), {"eod": eod})()
        monkeypatch.setattr(provider, "megatron_tokenizer", lambda t=tokenizer: t)
        call = lambda: ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)  # noqa: E731
        if not fails:
            assert call()[0] is not None
            continue
        with pytest.raises(ZephonArgumentError) as error:
            call()
        message = str(error.value)
        for needle in ("--tokenizer-model", "HuggingFaceTokenizer '/models/other'",
                       f"id {recipe_eos + 1}", f"with {recipe_eos}", "demo"):
            assert needle in message, (needle, message)
    for null in null_tokenizers():  # the entry's default: not compared
        monkeypatch.setattr(provider, "megatron_tokenizer", lambda null=null: null)
        assert ZephonDatasetsProvider(lambda: args, lambda: Topology())(None)[0] is not None


def null_tokenizers() -> list[Any]:
    """Megatron's NullTokenizer of 4096 ids as megatron-core <= 0.18 builds it, and as 0.19
    does (wrapped in DefaultTokenizerText; the real one where megatron-core 0.19 is here)."""
    inner = type("NullTokenizer", (), {"eod": 4095})()
    found = [type("NullTokenizer", (), {"eod": 4096})(),
             type("DefaultTokenizerText", (), {"eod": 4095, "library": "null-text",
                                               "_tokenizer": inner})()]
    try:
        from megatron.core.tokenizers import MegatronTokenizer

        real = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"},
                                                 vocab_size=4096)
    except (ImportError, AssertionError):  # megatron-core 0.16 has no null library
        return found
    assert real.eod == 4095
    return [*found, real]


def test_the_eod_of_a_null_tokenizer_is_refused_unless_chosen(monkeypatch) -> None:
    from zephon_megatron import tokenizer_checks

    recipe = type("Recipe", (), {"source": "ids.toml", "tokenizer": None})()  # token ids
    for null in null_tokenizers():
        with pytest.raises(ZephonArgumentError, match="made up from --vocab-size"):
            tokenizer_checks._megatron_eod(recipe, null)
        monkeypatch.setattr(tokenizer_checks, "_null_eod_chosen", lambda: True)
        assert tokenizer_checks._megatron_eod(recipe, null) == null.eod
        monkeypatch.undo()


def test_under_pretrain_a_provider_error_is_printed_by_rank_0_only(monkeypatch, capsys) -> None:
    """Inside pretrain() (exit_on_error) a problem found by the provider exits with status 2,
    printed once, by global rank 0, with no traceback; elsewhere it is raised."""
    from zephon_megatron.provider import ZephonDatasetsProvider

    args = parse(megatron_argv(PACKED, "--zephon-lanes", "3"))  # 3 lanes for 2 readers
    provider = ZephonDatasetsProvider(lambda: args, lambda: Topology(0, 2))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ZephonArgumentError, match="--zephon-lanes 3: 3 lanes cannot be shared"):
        provider(None)
    provider.exit_on_error = True
    for rank, printed in ((1, 0), (0, 1)):  # the global rank, as torch.distributed gives it
        monkeypatch.setattr("zephon_megatron.provider.global_rank", lambda rank=rank: rank)
        with pytest.raises(SystemExit) as stopped:
            provider(None)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.count("3 lanes cannot be shared by 2") == printed and "Traceback" not in err
