"""The TorchTitan dataloader with mixture stages from its recipe: the recipe pipeline's
microbatches across both boundaries and the ramp at two ranks, a resume at one rank from
their states inside the ramp, and the schedule in the metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit.stages import LANES, ROW_TOKENS, ROWS, core_inputs, write_stage_run
from zephon_torchtitan.dataloader import ZephonDataLoader

SEQ_LEN = ROW_TOKENS - 1


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tokenizer_dir) -> Path:
    return write_stage_run(tmp_path_factory.mktemp("titan-stages"), tokenizer_dir,
                           to_training='return_labels = true\neos_mask_loss = true\n'
                                       'position_mode = "preserve"')


def build(recipe: Path, rank: int = 0, world: int = 1) -> ZephonDataLoader:
    return ZephonDataLoader.Config(recipe=str(recipe), infinite=True).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
        local_batch_size=ROWS)


def global_inputs(loaders: list, iterators: list, rounds: int) -> dict[int, list]:
    """{global microbatch: input ids} of ``rounds`` rounds of every lane: rank ``r`` of
    ``W`` reads lanes ``r, r + W, ...``, one microbatch each a round."""
    world = len(loaders)
    out = {}
    for _ in range(rounds):
        for rank, iterator in enumerate(iterators):
            for lane in range(rank, LANES, world):
                batch, _labels = next(iterator)
                index = loaders[rank]._session.meter.totals["microbatches"] - 1
                out[(index // (LANES // world)) * LANES + lane] = batch["input"].reshape(
                    -1).tolist()  # rows as one (this recipe's layout flattens them)
    return out


def test_stages_from_the_recipe_reach_the_trainer_at_any_size_and_resume(recipe):
    reference = [[t for row in rows for t in row]
                 for rows in core_inputs(recipe, 120)]  # boundaries near microbatches 46, 108
    ranks = [build(recipe, r, 2) for r in range(2)]
    iterators = [iter(dl) for dl in ranks]
    first = global_inputs(ranks, iterators, 14)  # microbatches 0-55: into the ramp
    assert [first[g] for g in range(56)] == reference[:56]
    assert ranks[0].metrics()["zephon/tokens_seen/math"] > 0
    single = build(recipe)
    single.load_state_dict({**ranks[0].state_dict(), **ranks[1].state_dict()})
    rest = global_inputs([single], [iter(single)], 16)
    assert [rest[g] for g in range(64)] == reference[56:]
