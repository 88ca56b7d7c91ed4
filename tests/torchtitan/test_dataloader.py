"""ZephonDataLoader in process: build kwargs, batch layout, masking, state, refusals."""

from __future__ import annotations

import gc
import json
import multiprocessing
import pickle
import sys
import threading
import time
import traceback
import warnings
from dataclasses import replace
from multiprocessing import synchronize
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from zephon import ConfigError, StateMismatchError
from zephon.engine.workers import block_prefix
from zephon_torchtitan import config_checks as preflight
from zephon_torchtitan.dataloader import ZephonDataLoader


def build(recipe, *, rank=0, world=1, seq_len=64, rows=2, **options):
    return ZephonDataLoader.Config(recipe=str(recipe), **options).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=seq_len,
        local_batch_size=rows)


def take(dl, n):
    out, it = [], iter(dl)
    for _ in range(n):
        out.append(next(it))
    return out


@pytest.fixture
def demo_recipe(tmp_path, recipes):
    return recipes.write(tmp_path / "demo.toml", datasets=recipes.demo(), lanes=4)


def test_layouts_for_both_torchtitan_apis(demo_recipe, tmp_path, recipes):
    (inputs, labels), = take(build(demo_recipe), 1)
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (1, 128)
    upstream = ZephonDataLoader.Config(recipe=str(demo_recipe)).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, max_context_length=64,
        num_tokens_per_batch=128)
    (flat, flat_labels), = take(upstream, 1)
    assert flat["input"].shape == flat_labels.shape == (128,)
    assert torch.equal(flat["input"], inputs["input"].view(-1))
    rows = recipes.write(tmp_path / "rows.toml", datasets=recipes.demo(), lanes=4,
                         to_training='eos_mask_loss = true\nflatten = false')
    (row_inputs, _), = take(build(rows), 1)
    assert row_inputs["input"].shape == (2, 64)
    assert torch.equal(row_inputs["input"].view(1, -1), inputs["input"])
    with pytest.raises(ConfigError, match="multiple of max_context_length"):
        ZephonDataLoader.Config(recipe=str(demo_recipe)).build(
            dp_world_size=1, dp_rank=0, max_context_length=64, num_tokens_per_batch=100)


def test_eos_mask_loss_and_position_mode(demo_recipe, demo_assets):
    from zephon.text.tokenizer import load_tokenizer

    eos = load_tokenizer(demo_assets["tokenizer"]).eos_token_id
    for inputs, labels in take(build(demo_recipe, seq_len=256), 4):
        at_eos = inputs["input"] == eos
        assert bool(at_eos.any())
        assert bool((labels[at_eos] == -100).all())
        after_eos = torch.roll(at_eos, 1, dims=-1)
        assert bool((inputs["positions"][after_eos] == 0).all())
    trains_eos = build(demo_recipe, seq_len=256, eos_mask_loss=False,
                       position_mode="sequence")
    inputs, labels = take(trains_eos, 1)[0]
    assert bool((labels[inputs["input"] == eos] != -100).all())
    assert torch.equal(inputs["positions"].view(2, 256), torch.arange(256).repeat(2, 1))


def test_labels_are_the_next_input_shifted_once(tmp_path, recipes, demo_assets):
    """Each label is the token after its input, in the row it came from (not shifted twice,
    not across rows); only EOS positions (eos_mask_loss) are masked in wrap-packed rows."""
    from zephon.text.tokenizer import load_tokenizer

    eos = load_tokenizer(demo_assets["tokenizer"]).eos_token_id
    recipe = recipes.write(tmp_path / "rows.toml", datasets=recipes.demo(), lanes=2,
                           to_training="eos_mask_loss = true\nflatten = false")
    for inputs, labels in take(build(recipe, seq_len=128, rows=4), 6):
        tokens, within = inputs["input"], labels[:, :-1]
        at_eos = tokens[:, :-1] == eos
        assert torch.equal(within[~at_eos], tokens[:, 1:][~at_eos])
        assert bool((within[at_eos] == -100).all())
        assert bool((labels[:, -1] != -100).any())  # a row's last label is its extra token


def test_padding_is_masked_and_reported(tmp_path, recipes):
    recipe = recipes.write(tmp_path / "pad.toml", datasets=recipes.demo(), lanes=1,
                           pack="first_fit")
    dl = build(recipe, seq_len=512, rows=1)
    for inputs, labels in take(dl, 3):
        padded = (inputs["positions"][0, 1:] == 0) & (inputs["input"][0, 1:] == 0)
        assert bool((labels[0, 1:][padded] == -100).all())
    stats = dl.stats()
    assert stats["microbatches"] == 3 and stats["padding"] > 0
    assert stats["valid"] < stats["tokens"] - stats["padding"] + 1
    assert "padding" in dl.report()


def test_state_is_keyed_per_lane_and_resumes_at_another_dp_size(demo_recipe):
    ranks = [build(demo_recipe, rank=r, world=2) for r in range(2)]
    iters = [iter(dl) for dl in ranks]
    for _ in range(3):
        for it in iters:
            next(it)
    states = [dl.state_dict() for dl in ranks]
    assert sorted(states[0]) == ["lane_0", "lane_2"] and sorted(states[1]) == ["lane_1", "lane_3"]
    assert all(isinstance(v, str) and json.loads(v)["lane"] in (0, 1, 2, 3)  # plain JSON text
               for s in states for v in s.values())
    expected = [next(it) for _ in range(2) for it in iters]  # global order: rank 0, rank 1
    single = build(demo_recipe)
    assert sorted(single.state_dict()) == ["lane_0", "lane_1", "lane_2", "lane_3"]
    single.load_state_dict({**states[0], **states[1]})
    for (want, want_labels), (got, got_labels) in zip(expected, take(single, 4)):
        assert torch.equal(want["input"], got["input"])
        assert torch.equal(want_labels, got_labels)


def test_lanes_left_open_are_eight_per_rank_and_a_resume_keeps_the_checkpoints(
        tmp_path, recipes, monkeypatch):
    """zephon 0.2.0 made the lanes the data-parallel size, so another size changed the data.
    Left open here, they are 8 per rank of the first launch; a resume finds the lane count in
    the checkpoint it is about to load and continues the same global batches."""
    recipe = recipes.write(tmp_path / "open.toml", datasets=recipes.demo(), lanes=2)
    recipe.write_text(recipe.read_text().replace("lanes = 2\n", ""))
    folder = tmp_path / "checkpoint"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranks = [build(recipe, rank=r, world=2, checkpoint_folder=str(folder))
                 for r in range(2)]
    assert not [w for w in caught if "lanes" in str(w.message)]
    assert [dl.lanes for dl in ranks] == [16, 16]
    assert build(recipe, checkpoint_folder=str(folder)).lanes == 8  # no checkpoint yet
    iters = [iter(dl) for dl in ranks]
    for _ in range(3):
        for it in iters:
            next(it)
    state = {**ranks[0].state_dict(), **ranks[1].state_dict()}
    dcp.save({"dataloader": state}, checkpoint_id=str(folder / "step-3"))
    expected = [next(it) for _ in range(2) for it in iters]
    assert build(recipe).lanes == 8  # a loader not told where the checkpoints are
    single = build(recipe, checkpoint_folder=str(folder))
    assert single.lanes == 16
    single.load_state_dict(state)
    for (want, want_labels), (got, got_labels) in zip(expected, take(single, 4), strict=True):
        assert torch.equal(want["input"], got["input"])
        assert torch.equal(want_labels, got_labels)
    with pytest.raises(ConfigError, match="16 lanes cannot be shared by"):
        build(recipe, rank=0, world=3, checkpoint_folder=str(folder))


def test_incompatible_resumes_are_refused(demo_recipe, tmp_path, recipes):
    dl = build(demo_recipe)
    take(dl, 2)
    state = dl.state_dict()
    with pytest.raises(StateMismatchError, match=r"seed.*--checkpoint\.exclude_from_loading "
                                                 r"dataloader"):
        build(demo_recipe, seed=99).load_state_dict(state)
    eight = recipes.write(tmp_path / "eight.toml", datasets=recipes.demo(), lanes=8)
    with pytest.raises(StateMismatchError, match="lane count"):
        build(eight).load_state_dict({k: state[k] for k in ("lane_0", "lane_1")})
    with pytest.raises(StateMismatchError, match="another dataloader"):
        build(demo_recipe).load_state_dict({"dp_rank_0": pickle.dumps({}), "world_size": 1})
    with pytest.raises(ConfigError, match="4 lanes cannot be shared by"):
        build(demo_recipe, rank=0, world=3)


def test_finite_and_infinite(docs_dir, tmp_path, recipes):
    texts = [f"Document {i} " + "kalo mishi rune tashi " * 20 for i in range(6)]
    recipe = recipes.write(tmp_path / "small.toml", lanes=1, datasets=(
        f'[[datasets]]\nname = "small"\npath = "{docs_dir(texts)}"\n'))
    finite = list(build(recipe, rows=1))
    assert 0 < len(finite) < 30
    infinite = take(build(recipe, rows=1, infinite=True), 2 * len(finite))
    for (a, _), (b, _) in zip(finite, infinite[len(finite):]):
        assert torch.equal(a["input"], b["input"])


def test_infinite_loader_resumes_across_the_wrap(docs_dir, tmp_path, recipes):
    """TorchTitan #1357: the state survives the loop back to the start of the data, whether
    it is saved on the last batch of a pass or after the wrap."""
    texts = [f"Document {i} " + "kalo mishi rune tashi " * 20 for i in range(6)]
    recipe = recipes.write(tmp_path / "small.toml", lanes=2, datasets=(
        f'[[datasets]]\nname = "small"\npath = "{docs_dir(texts)}"\n'))
    one_pass = len(list(build(recipe, rows=1)))
    straight = take(build(recipe, rows=1, infinite=True), 2 * one_pass + 3)
    for stop in (one_pass, one_pass + 2, 2 * one_pass):
        first = build(recipe, rows=1, infinite=True)
        take(first, stop)
        state = first.state_dict()
        resumed = build(recipe, rows=1, infinite=True)
        resumed.load_state_dict(state)
        for (a, la), (b, lb) in zip(take(resumed, 3), straight[stop:stop + 3], strict=True):
            assert torch.equal(a["input"], b["input"]) and torch.equal(la, lb)


@pytest.mark.parametrize("workers", [0, 1])
def test_validation_loaders_built_and_dropped_each_run_leave_nothing_behind(tmp_path, recipes,
                                                                           workers,
                                                                           monkeypatch):
    """TorchTitan's validator builds a loader per validation run and drops its iterator after
    ``validator.steps``: no thread, worker process or shared memory may outlive it."""
    recipe = recipes.write(tmp_path / "valid.toml", datasets=recipes.demo(), lanes=2)
    recipe.write_text(recipe.read_text().replace(
        "prefetch = 0", f"prefetch = 4\nworkers = {workers}"))
    config = ZephonDataLoader.Config(recipe=str(recipe))
    threads = set(threading.enumerate())
    others = set(multiprocessing.active_children())  # left by earlier tests, exiting
    semaphores: list[str] = []  # what this process names in /dev/shm; other jobs' are theirs
    make_name = synchronize.SemLock._make_name
    monkeypatch.setattr(synchronize.SemLock, "_make_name", staticmethod(
        lambda: semaphores.append(name := make_name()) or name))
    mine = f"{block_prefix()}*"  # the workers' shared memory blocks for this process
    for _ in range(3):
        loader = replace(config, infinite=False).build(
            dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2)
        take(loader, 3)
        assert len(set(multiprocessing.active_children()) - others) == workers
        del loader
        gc.collect()
        # Joined until none is left (a loaded machine may take a while to schedule them): a
        # producer may still be starting when its iterator is
        # dropped (it then stops at once), so one pass over the threads could miss it.
        deadline = time.monotonic() + 60
        while (extra := set(threading.enumerate()) - threads) and time.monotonic() < deadline:
            gc.collect()  # a no-op while another thread is collecting: tried again
            for thread in extra:
                thread.join(0.5)
        left = set(threading.enumerate()) - threads
        assert not left, "\n".join(  # where each thread left behind is, for the record
            f"{t.name}:\n" + "".join(traceback.format_stack(sys._current_frames()[t.ident]))
            for t in left if t.ident in sys._current_frames())
        assert set(multiprocessing.active_children()) <= others
        assert sorted(Path("/dev/shm").glob(mine)) == []
        assert [n for n in semaphores if Path("/dev/shm", "sem." + n.lstrip("/")).exists()] == []
    assert bool(semaphores) == bool(workers)  # the check saw the worker pool's semaphores


def test_bad_recipes_fail_naming_the_problem(tmp_path, recipes):
    missing = recipes.write(tmp_path / "missing.toml",
                            datasets='[[datasets]]\nname = "gone"\npath = "no/such/dir"\n')
    with pytest.raises(ConfigError, match="no/such/dir"):
        ZephonDataLoader.Config(recipe=str(missing))
    no_tok = recipes.write(tmp_path / "notok.toml", datasets=recipes.demo(),
                           tokenizer="./no_such_tokenizer")
    with pytest.raises(ConfigError, match="no_such_tokenizer"):
        ZephonDataLoader.Config(recipe=str(no_tok))
    unknown = recipes.write(tmp_path / "unknown.toml", datasets=recipes.demo(),
                            extra="[pack2]\nx = 1")
    with pytest.raises(ConfigError, match="pack2"):
        ZephonDataLoader.Config(recipe=str(unknown))
    cu = recipes.write(tmp_path / "cu.toml", datasets=recipes.demo(),
                       to_training="return_cu_seqlens = true")
    with pytest.raises(ConfigError, match="return_cu_seqlens"):
        build(cu)
    with pytest.raises(ConfigError, match="recipe"):
        ZephonDataLoader.Config().build(dp_world_size=1, dp_rank=0, seq_len=8,
                                        local_batch_size=1)


def test_tokenizer_mismatch_is_refused(demo_recipe, small_tokenizer):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    theirs = HuggingFaceTokenizer(tokenizer_path=small_tokenizer)
    with pytest.raises(ConfigError, match=r"--dataloader\.no-check-tokenizer"):
        ZephonDataLoader.Config(recipe=str(demo_recipe)).build(
            dp_world_size=1, dp_rank=0, tokenizer=theirs, seq_len=64, local_batch_size=2)


def _without_to_training(path: Path, keep: str = "") -> Path:
    """The recipe with its [to_training] table (the last one) replaced by ``keep``."""
    head = path.read_text().partition("[to_training]")[0]
    path.write_text(head + (f"[to_training]\n{keep}\n" if keep else ""))
    return path


def test_the_presets_choices_are_defaults_a_recipe_may_leave_out(tmp_path, recipes,
                                                                  demo_assets):
    from zephon.text.tokenizer import load_tokenizer

    eos = load_tokenizer(demo_assets["tokenizer"]).eos_token_id
    bare = _without_to_training(recipes.write(tmp_path / "bare.toml", datasets=recipes.demo()))
    assert "[to_training]" not in bare.read_text()
    loader = build(bare, seq_len=256)
    assert loader.options["eos_mask_loss"] and loader.options["return_labels"]
    inputs, labels = take(loader, 1)[0]
    assert bool((labels[inputs["input"] == eos] == -100).all())  # the adapter's default
    alone = _without_to_training(recipes.write(tmp_path / "alone.toml",
                                               datasets=recipes.demo()), "eos_mask_loss = true")
    preflight.preflight(None, {"dataloader": ZephonDataLoader.Config(recipe=str(alone))})
    assert build(alone).options["eos_mask_loss"]  # not "needs return_labels=True"
    off = _without_to_training(recipes.write(tmp_path / "off.toml", datasets=recipes.demo()),
                               "eos_mask_loss = false")
    assert not build(off).options["eos_mask_loss"]
    contrary = _without_to_training(recipes.write(tmp_path / "contrary.toml",
                                                  datasets=recipes.demo()),
                                    "return_labels = false")
    with pytest.raises(ConfigError, match=r"return_labels = False conflicts with TorchTitan"):
        build(contrary)


def test_a_data_restart_is_named_by_the_preflight_and_kept_in_the_state(demo_recipe,
                                                                        tmp_path):
    """A run that loads the checkpoint of step 6 but excludes the dataloader from it starts
    its data over at step 6: the preflight says so, and the loader state keeps it, which is
    how zephon trace maps later steps to this data."""
    from types import SimpleNamespace

    import torch.distributed.checkpoint as dcp

    from zephon.integration import state_from_text
    from zephon_torchtitan.config_checks import preflight

    first = build(demo_recipe)
    take(first, 3)
    dcp.save({"dataloader": first.state_dict()}, checkpoint_id=str(tmp_path / "ckpt" / "step-6"),
             no_dist=True)
    config = ZephonDataLoader.Config(recipe=str(demo_recipe), fit_vocab=False,
                                     tokenizer_from_recipe=False)
    root = SimpleNamespace(
        dump_folder=str(tmp_path), dataloader=config, validator=None,
        checkpoint=SimpleNamespace(enable=True, folder="ckpt", load_step=-1,
                                   exclude_from_loading=["dataloader"]),
        parallelism=SimpleNamespace(tensor_parallel_degree=1, pipeline_parallel_degree=1,
                                    context_parallel_degree=1),
        training=SimpleNamespace(seq_len=64, local_batch_size=2))
    installed = preflight(root)["dataloader"]
    assert installed.data_restart_step == 6
    restarted = installed.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64,
                                local_batch_size=2)
    take(restarted, 2)
    entries = state_from_text(restarted.state_dict(), "state")
    assert {e["start_step"] for e in entries.values()} == {6}
    root.checkpoint.exclude_from_loading = []
    assert preflight(root)["dataloader"].data_restart_step == 0  # a resume: no restart


def test_the_preflight_says_where_the_data_ends_and_records_the_run(docs_dir, tmp_path,
                                                                    recipes, caplog):
    """A dataset that does not repeat and ends before training.steps is named before the
    model is built, with the rows it yields and the steps they fill (TorchTitan then ends the
    run there); the run's folder holds the record ``zephon trace`` reads."""
    import logging
    from types import SimpleNamespace

    from zephon.integration import RunRecord

    texts = [f"Document {i} " + "kalo mishi rune tashi " * 30 for i in range(40)]
    recipe = recipes.write(tmp_path / "small.toml", lanes=2, datasets=(
        f'[[datasets]]\nname = "small"\npath = "{docs_dir(texts)}"\n'))

    def root(steps: int, **loader) -> SimpleNamespace:
        return SimpleNamespace(
            dump_folder=str(tmp_path / "run"), validator=None,
            dataloader=ZephonDataLoader.Config(recipe=str(recipe), **loader),
            checkpoint=SimpleNamespace(enable=False),
            parallelism=SimpleNamespace(tensor_parallel_degree=1, pipeline_parallel_degree=1,
                                        context_parallel_degree=1),
            training=SimpleNamespace(seq_len=64, local_batch_size=2, global_batch_size=8,
                                     steps=steps))

    def said(steps: int, **loader) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            preflight.preflight(root(steps, **loader))
        return [r.getMessage() for r in caplog.records if "data ends" in r.getMessage()]

    rows = sum(len(b.records) for b in build(recipe, seq_len=64, rows=2)._pipeline)
    [message] = said(1000)
    assert "the training data ends before training.steps 1000: 'small' not repeated" in message
    assert 'add repeat = ["small"] to [mixture]' in message and "--dataloader.infinite" in message
    estimated = int(message.split("yields about ")[1].split(" rows")[0].replace(",", ""))
    assert 0.8 * rows <= estimated <= 1.25 * rows, (estimated, rows)
    assert f"about {estimated // 8} steps of 8 rows" in message
    assert said(1000, infinite=True) == []  # an infinite loader starts over
    assert said(rows // 8) == []  # what the data fills
    record = RunRecord.read(tmp_path / "run")
    assert (record.framework, record.recipe, record.lanes, record.dp_size,
            record.microbatch_size, record.seq_len, record.microbatches_per_step,
            record.checkpoints) == ("torchtitan", str(recipe), 2, 1, 2, 64, 4, None)


@pytest.mark.parametrize("eos, named", [
    (7, "no sampled document of this dataset ends with it; they end with 2 (300 of 300)"),
    (5000, "the data's ids are 0..999 ([tokenize] vocab_size), so none is ever masked"),
    (2, None)])
def test_an_eos_that_token_id_data_never_ends_with_is_named_before_the_model(tmp_path, eos,
                                                                             named):
    """eos_mask_loss (TorchTitan's default) on token-id data masks after the id the recipe
    names: one the documents of an indexed dataset never end with, or one beyond the data's
    ids, would mask nothing, silently."""
    from types import SimpleNamespace

    from tests.kit.token_ids import token_id_recipe

    recipe = token_id_recipe(tmp_path, "lanes = 2\n", '[mixture]\nrepeat = ["web"]\n'
                             f'[to_training]\neos_token_id = {eos}\n')
    root = SimpleNamespace(
        dump_folder=str(tmp_path / "run"), validator=None,
        dataloader=ZephonDataLoader.Config(recipe=str(recipe), tokenizer_from_recipe=False),
        checkpoint=SimpleNamespace(enable=False),
        parallelism=SimpleNamespace(tensor_parallel_degree=1, pipeline_parallel_degree=1,
                                    context_parallel_degree=1),
        training=SimpleNamespace(seq_len=64, local_batch_size=2, steps=10))
    if named is None:
        preflight.preflight(root)
        return
    with pytest.raises(ConfigError, match="preflight found problems") as refused:
        preflight.preflight(root)
    assert named in str(refused.value) and "eos_mask_loss masks the label after EOS id" in \
        str(refused.value)
