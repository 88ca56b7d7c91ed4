"""The Megatron adapter with mixture stages from a --zephon-recipe: the recipe pipeline's
microbatches across both boundaries and the ramp at two ranks, and a resume at one rank from
their states inside the ramp. (A --data-path blend keeps fixed weights: see
test_megatron_blend.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron_helpers import megatron_argv, parse

from tests.kit.stages import ROW_TOKENS, ROWS, core_inputs, write_stage_run
from zephon.recipe import DataRecipe
from zephon_megatron.arguments import settings_from_args
from zephon_megatron.provider import Topology, build_iterator

SEQ_LEN = ROW_TOKENS - 1


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tokenizer_dir) -> Path:
    return write_stage_run(tmp_path_factory.mktemp("megatron-stages"), tokenizer_dir)


def iterator(recipe: Path, rank: int = 0, world: int = 1):
    args = parse(megatron_argv(recipe, "--zephon-prefetch", "0", seq=SEQ_LEN, mbs=ROWS,
                               masking=[]))
    return build_iterator(DataRecipe.from_toml(recipe), settings_from_args(args),
                          Topology(rank, world))


def test_stages_from_the_recipe_reach_megatron_at_any_size_and_resume(recipe):
    reference = core_inputs(recipe, 120)  # boundaries near microbatches 46 and 108
    ranks = [iterator(recipe, r, 2) for r in range(2)]
    got: dict[int, list] = {}
    for _ in range(28):  # 56 global microbatches: into the ramp
        for it in ranks:
            data = next(it)
            got[it.last_global_microbatch] = data["tokens"].tolist()
    assert [got[g] for g in range(56)] == reference[:56]
    states = [it.save_state() for it in ranks]
    single = iterator(recipe)
    single.restore_state(states)
    rest = {}
    for _ in range(64):
        data = next(single)
        rest[single.last_global_microbatch] = data["tokens"].tolist()
    assert [rest[g] for g in range(56, 120)] == reference[56:]
