"""zephon_torch with mixture stages from its recipe: the recipe pipeline's microbatches across
both boundaries and the ramp, a resume inside the ramp, and tokens seen by stage."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from tests.kit.stages import ROW_TOKENS, core_inputs, write_stage_run
from zephon_torch import ZephonIterableDataset

SEQ_LEN = ROW_TOKENS - 1


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tokenizer_dir) -> Path:
    return write_stage_run(tmp_path_factory.mktemp("torch-stages"), tokenizer_dir,
                                to_training="return_labels = true")


def inputs(items) -> list[list[list[int]]]:
    return [item["input_ids"].tolist() for item in items]


def test_stages_from_the_recipe_reach_the_loop_and_resume_inside_the_ramp(recipe):
    reference = core_inputs(recipe, 120)  # boundaries near microbatches 46 and 108
    dataset = ZephonIterableDataset(recipe, seq_len=SEQ_LEN, infinite=True)
    iterator = iter(dataset)
    assert inputs(islice(iterator, 40)) == reference[:40]
    assert dataset.metrics()["zephon/tokens_seen/math"] == 0  # stage 1 has no math
    assert inputs(islice(iterator, 15)) == reference[40:55]
    state = dataset.state_dict()  # microbatch 55: inside the ramp
    resumed = ZephonIterableDataset(recipe, seq_len=SEQ_LEN, infinite=True)
    resumed.load_state_dict(state)
    assert inputs(islice(iter(resumed), 65)) == reference[55:]
    metrics = resumed.metrics()
    assert metrics["zephon/tokens_seen/math"] > 0 and metrics["zephon/target/math"] > 0
