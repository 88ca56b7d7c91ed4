"""zephon.integration: the policy every framework adapter shares (geometry, lanes, merged
states) and one rank's loader session."""

from __future__ import annotations

import json
from itertools import islice

import pytest

from zephon import Pipeline
from zephon.errors import ConfigError, StateMismatchError
from zephon.integration import (
    LoaderSession,
    RunGeometry,
    choose_lanes,
    lanes_problem,
    merge_states,
)
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource


def test_lanes_come_from_the_recipe_the_option_the_checkpoint_then_the_readers():
    assert choose_lanes(3, recipe=12, saved=6).lanes == 12
    assert choose_lanes(3, option=6, saved=12).why == "the lanes option 6"
    assert choose_lanes(3, saved=6).lanes == 6
    first = choose_lanes(3)
    assert first.lanes == 24 and "dividing 24" in first.why
    assert choose_lanes(2, recipe=8, option=8).lanes == 8
    with pytest.raises(ConfigError, match=r"r\.toml: lanes = 8 conflicts with --lanes 4"):
        choose_lanes(2, recipe=8, option=4, option_name="--lanes", source="r.toml")


def test_a_lane_problem_names_the_sizes_that_fit():
    assert lanes_problem(96, 12) is None
    assert lanes_problem(8, 3) == ("8 lanes cannot be shared by 3 data-parallel readers: the "
                                   "data-parallel size must divide the lanes ([1, 2, 4, 8])")


def test_geometry_is_checked_and_read_from_the_launcher(monkeypatch):
    with pytest.raises(ConfigError, match="rank 2 of size 2"):
        RunGeometry(2, 2)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # a group left by another test
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert RunGeometry.from_environment() == RunGeometry(3, 4)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK='x'"):
        RunGeometry.from_environment()


def test_merged_states_must_agree_on_shared_lanes():
    assert merge_states([{"lane_0": 1}, {"lane_1": 2}, {"lane_1": 2}]) == {"lane_0": 1,
                                                                            "lane_1": 2}
    with pytest.raises(StateMismatchError, match="'lane_1'"):
        merge_states([{"lane_1": 2}, {"lane_1": 3}])


def session(two_datasets, tokenizer_dir, dp_rank: int = 0, dp_size: int = 1) -> LoaderSession:
    source = StaticMixtureWorkSource([Dataset.from_path("short", two_datasets["short"]),
                                      Dataset.from_path("long", two_datasets["long"])], seed=2)
    pipeline = (Pipeline(source).options(lanes=4, dp_rank=dp_rank, dp_world_size=dp_size,
                                         prefetch=0)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(17).batch(2))
    return LoaderSession(pipeline, {"return_labels": True, "return_loss_mask": True})


def ids(items) -> list[list[int]]:
    return [item["input_ids"].flatten().tolist() for item in items]


def test_a_session_hands_out_training_tensors_and_resumes_exactly(two_datasets, tokenizer_dir):
    reference = ids(session(two_datasets, tokenizer_dir))
    first = session(two_datasets, tokenizer_dir)
    items = list(islice(iter(first), 3))
    assert set(items[0]) >= {"input_ids", "labels", "loss_mask"}
    assert items[0]["input_ids"].shape == (2, 16)
    state = json.loads(json.dumps(first.state_dict()))
    metrics = first.metrics()
    assert metrics["zephon/loss_share"] == pytest.approx(
        sum(float(i["loss_mask"].sum()) for i in items) / (3 * 2 * 16))
    resumed = session(two_datasets, tokenizer_dir)
    resumed.load_state_dict(state)
    assert ids(resumed) == reference[3:]
    assert ids(resumed) == reference, "a session iterated again starts the data over"


@pytest.mark.parametrize("options", [
    {"rename_fields": {"input_ids": "inputs", "loss_mask": "weights"}},
    {"exclude_fields": ["input_ids"]},
])
def test_a_session_counts_tensors_renamed_or_left_out(two_datasets, tokenizer_dir, options):
    """The session finds the tensors under the names the recipe gives them (a framework's
    own: tokens, inputs) or counts from the rows where they are left out."""
    plain = session(two_datasets, tokenizer_dir)
    list(islice(iter(plain), 3))
    other = session(two_datasets, tokenizer_dir)
    other.training.update(options)
    items = list(islice(iter(other), 3))
    assert "input_ids" not in items[0]
    expected, got = plain.metrics(), other.metrics()
    for name in ("zephon/tokens_per_s", "zephon/wait_ms", "zephon/this_rank/wait_ms",
                 "zephon/this_rank/tokens_per_s"):
        expected.pop(name), got.pop(name)
    assert got == expected


def test_states_of_two_readers_merge_into_one_reader(two_datasets, tokenizer_dir):
    reference = ids(session(two_datasets, tokenizer_dir))
    readers = [session(two_datasets, tokenizer_dir, rank, 2) for rank in range(2)]
    for reader in readers:
        list(islice(iter(reader), 2))
    one = session(two_datasets, tokenizer_dir)
    one.load_state_dict(merge_states(reader.state_dict() for reader in readers))
    assert ids(one) == reference[4:]


def test_restart_starts_over_and_a_new_iterator_continues(two_datasets, tokenizer_dir):
    reference = ids(session(two_datasets, tokenizer_dir))
    reader = session(two_datasets, tokenizer_dir)
    first = reader.batches()
    assert ids(out for _, out in islice(first, 2)) == reference[:2]
    second = reader.batches()  # closes the first: one consumer at a time
    assert list(first) == []
    assert ids(out for _, out in islice(second, 1)) == reference[2:3]
    reader.restart()
    assert ids(out for _, out in islice(reader.batches(), 2)) == reference[:2]
    assert reader.meter.totals["microbatches"] == 5


def test_a_dropped_session_stops_its_prefetch_without_the_collector(two_datasets,
                                                                  tokenizer_dir):
    """A framework that drops a loader mid-epoch (TorchTitan's validator after its steps)
    must not leave its prefetch thread running until the garbage collector happens to find a
    cycle: the session's iterator holds no reference back to the session."""
    import gc
    import threading

    before = set(threading.enumerate())
    gc.disable()
    try:
        dropped = session(two_datasets, tokenizer_dir)
        dropped.pipeline = dropped.pipeline.options(prefetch=2)
        iterator = iter(dropped)
        next(iterator)
        producers = [t for t in set(threading.enumerate()) - before
                     if t.name.startswith("zephon-rank")]
        assert producers
        del iterator, dropped
        for producer in producers:
            producer.join(10)
        assert not any(p.is_alive() for p in producers)
    finally:
        gc.enable()
