"""A loader state is checked before it is used: each misfit is a StateMismatchError that names
the entry and the field, raised by ``load_state_dict`` before any iteration, and a failed load
leaves the loader as it was."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.kit.elastic import digest
from tests.kit.state import resealed
from tests.kit.state_corpus import STEPS, build, mid_run, write_corpus
from zephon import StateMismatchError
from zephon.ops.base import BuildContext, Node, OperatorSpec, RowOperator
from zephon.text.tokenizer import load_tokenizer


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    return write_corpus(tmp_path)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def lane_state(state: dict[str, Any], lane: int) -> dict[str, Any]:
    return state[f"lane_{lane}"]["lane_state"]


def source_state(state: dict[str, Any], lane: int, dataset: int) -> dict[str, Any]:
    return lane_state(state, lane)["nodes"][0]["sources"][dataset]


def test_an_entry_filed_under_another_lanes_key_is_refused(corpus, tokenizer):
    state = mid_run(build(corpus, tokenizer))
    state["lane_0"], state["lane_1"] = state["lane_1"], state["lane_0"]
    with pytest.raises(StateMismatchError, match="loader state 'lane_0': lane is 1, but the "
                                                 "entry is filed under 'lane_0'"):
        build(corpus, tokenizer).load_state_dict(resealed(state))


@pytest.mark.parametrize("dataset, position, message", [
    (0, [999, 0, 0], r"position\[0\] is 999, but lane 1 reads 6 work unit\(s\) of dataset 'a'"),
    (0, [0, -5, 0], r"position\[1\] is -5, must be >= 0"),
    (1, [0, 0, -1], r"position\[2\] is -1, must be >= 0"),
    (0, [0, 999, 0], r"position\[1\] is 999, but work unit 0 of dataset 'a' holds 8 rows"),
    (0, [0, 8, 1], r"position\[2\] is 1, but position\[1\] is past the last row"),
])
def test_positions_outside_the_plan_are_refused(corpus, tokenizer, dataset, position,
                                                message):
    state = mid_run(build(corpus, tokenizer))
    source = source_state(state, 1, dataset)
    source["position"] = position
    source["epoch"] = 0
    with pytest.raises(StateMismatchError,
                       match=rf"loader state 'lane_1': nodes\[0\]\.sources\[{dataset}\]\."
                             + message):
        build(corpus, tokenizer).load_state_dict(resealed(state))


def test_a_version_3_state_resumes_as_written(corpus, tokenizer):
    """Version 3 had no last round: its entries, without ``tail_from``, still resume."""
    reference = build(corpus, tokenizer)
    expected = [digest(b) for b in islice(reference, STEPS + 3)][STEPS:]
    state = mid_run(build(corpus, tokenizer))
    for entry in state.values():
        del entry["tail_from"]
        entry["version"] = 3
    resumed = build(corpus, tokenizer)
    resumed.load_state_dict(resealed(state))
    assert [digest(b) for b in islice(resumed, 3)] == expected


def test_a_json_lines_row_past_its_unit_is_an_error_when_first_read(corpus, tokenizer):
    state = mid_run(build(corpus, tokenizer))
    source = source_state(state, 1, 1)
    k = source["position"][0]
    source["position"] = [k, 999, 0]
    resumed = build(corpus, tokenizer)
    # rows of a byte range are counted only when it is read
    resumed.load_state_dict(resealed(state))
    with pytest.raises(StateMismatchError, match=rf"loader state 'lane_1': nodes\[0\]"
                                                 rf"\.sources\[1\]\.position is \[{k}, 999, 0\]"
                                                 rf", but work unit {k} of dataset 'b'"):
        list(islice(resumed, 20))


def _set(state: dict[str, Any], path: list[Any], value: Any) -> None:
    for key in path[:-1]:
        state = state[key]
    state[path[-1]] = value


def _delete(state: dict[str, Any], path: list[Any]) -> None:
    for key in path[:-1]:
        state = state[key]
    del state[path[-1]]


SOURCE = ["lane_1", "lane_state", "nodes", 0, "sources", 1]


@pytest.mark.parametrize("change, message", [
    (lambda s: _set(s, ["lane_1"], None), r"loader state 'lane_1' is None, must be a dict"),
    (lambda s: _set(s, ["lane_1"], [1, 2]), r"loader state 'lane_1' is \[1, 2\] \(list\), "
                                            "must be a dict"),
    (lambda s: _delete(s, ["lane_1", "lane_state", "nodes", 0, "sources"]),
     r"loader state 'lane_1': nodes\[0\]\.sources is missing"),
    (lambda s: _delete(s, ["lane_0", "consumed_global"]),
     "loader state 'lane_0': consumed_global is missing"),
    (lambda s: _set(s, [*SOURCE, "position", 1], "2"),
     r"loader state 'lane_1': nodes\[0\]\.sources\[1\]\.position\[1\] is '2' \(str\), must "
     "be an integer"),
    (lambda s: _set(s, ["lane_0", "consumed_global"], "4"),
     r"loader state 'lane_0': consumed_global is '4' \(str\), must be an integer"),
    (lambda s: _set(s, ["lane_1", "lane_state", "microbatches"], 2.0),
     r"loader state 'lane_1': microbatches is 2\.0, must be an integer"),
    (lambda s: _set(s, ["lane_1", "lane_state", "nodes", 2], None),
     r"loader state 'lane_1': nodes\[2\] is None, must be a dict"),
    (lambda s: _set(s, ["lane_1", "lane_state", "nodes", 0, "mixer"], []),
     r"loader state 'lane_1': nodes\[0\]\.mixer is \[\] \(list\), must be a dict"),
    (lambda s: _set(s, ["lane_0", "lane_state", "nodes", 1, "ended"], 0),
     r"loader state 'lane_0': nodes\[1\]\.ended is 0, must be true or false"),
    (lambda s: _set(s, ["lane_0", "lane_state", "nodes", 3, "stats", "dropped"], {}),
     r"loader state 'lane_0': nodes\[3\]\.stats\.dropped\.rows is missing"),
    (lambda s: _set(s, ["lane_0", "tail_from"], "0"),
     r"loader state 'lane_0': tail_from is '0' \(str\), must be an integer"),
    (lambda s: _set(s, ["lane_0", "tail_from"], 0),
     r"loader state entries disagree on where the last round of the data began"),
    (lambda s: [_set(s, [key, "tail_from"], 1) for key in s],
     r"loader state: tail_from is 1, but the last round begins at a whole round"),
    (lambda s: [_set(s, [key, "tail_from"], 0) for key in s],
     r"loader state 'lane_\d' has \d+ microbatches consumed, but \d+ global microbatches "
     r"imply 0 \(the last round of the data began at microbatch 0\)"),
])
def test_malformed_entries_are_named(corpus, tokenizer, change, message):
    state = mid_run(build(corpus, tokenizer))
    change(state)
    with pytest.raises(StateMismatchError, match=message):
        build(corpus, tokenizer).load_state_dict(resealed(state))


def _truncate_nodes(state: dict[str, Any]) -> None:
    lane_state(state, 0)["nodes"].pop()


def _lane_1_off_plan(state: dict[str, Any]) -> None:
    source_state(state, 1, 0)["position"] = [999, 0, 0]


@pytest.mark.parametrize("damage, message", [
    (_truncate_nodes, r"loader state 'lane_0': nodes holds 3 operator states, this pipeline "
                      "has 4"),
    (_lane_1_off_plan, r"loader state 'lane_1': nodes\[0\]\.sources\[0\]\.position\[0\]"),
])
def test_a_refused_state_is_refused_at_load_and_changes_nothing(corpus, tokenizer, damage,
                                                                message):
    reference = build(corpus, tokenizer)
    expected = [digest(b) for b in islice(reference, STEPS + 3)][STEPS:]
    pipeline = build(corpus, tokenizer)
    state = mid_run(pipeline)
    damage(state)
    with pytest.raises(StateMismatchError, match=message):
        pipeline.load_state_dict(resealed(state))
    assert [digest(b) for b in islice(pipeline, 3)] == expected


def _nodes(state: dict[str, Any], lane: int) -> list[dict[str, Any]]:
    return lane_state(state, lane)["nodes"]


def _shuffled(state: dict[str, Any], lane: int) -> list[dict[str, Any]]:
    return _nodes(state, lane)[2]["shuffler"]["buffer"]


@pytest.mark.parametrize("change, message", [
    (lambda s: _set(s, ["lane_0", "finished"], True),
     "loader state 'lane_0': finished is true, but lane_state is not at the end"),
    (lambda s: _set(_nodes(s, 1)[0], ["ended"], True),
     r"loader state 'lane_1': nodes\[1\] ended is false, but the mixer it reads \(nodes\[0\]\) "
     "has ended true"),
    (lambda s: _set(_nodes(s, 1)[2], ["ended"], True),
     r"loader state 'lane_1': nodes\[2\]\.shuffler\.buffer holds rows, but ended is true"),
    (lambda s: _set(_nodes(s, 1)[0]["mixer"], ["delivered", 0], 99),
     r"nodes\[0\]\.mixer\.delivered\[0\] is 99, but stats\.documents\.a is"),
    (lambda s: _set(_nodes(s, 1)[0]["mixer"], ["active", 1], False),
     r"nodes\[0\]\.mixer\.active\[1\] is false, but with on_exhausted='stop'"),
    (lambda s: _set(_nodes(s, 1)[0]["sources"][0], ["epoch"], 3),
     r"nodes\[0\]\.sources\[0\]\.epoch is 3, but work unit \d+ of lane 1 is read in epoch 0"),
    (lambda s: _set(_nodes(s, 1)[3], ["made"], 7),
     r"loader state 'lane_1': microbatches is 2, but the batch operator \(nodes\[3\]\) made 7"),
    (lambda s: _set(_nodes(s, 0)[1]["stats"], ["padding_tokens"], 5),
     r"nodes\[1\]\.stats\.padding_tokens is 5, but packer\.padding_tokens is 0"),
    (lambda s: _shuffled(s, 1).append(copy.deepcopy(_shuffled(s, 1)[0])),
     r"nodes\[2\]\.shuffler\.buffer holds 4 rows, more than buffer_size=3"),
    (lambda s: _set(_shuffled(s, 1)[0]["meta"], ["lane"], 0),
     r"nodes\[2\]\.shuffler\.buffer\[0\]\.meta\.lane is 0, but this is lane 1"),
    (lambda s: _set(_shuffled(s, 1)[0]["meta"], ["padding"], 3),
     r"nodes\[2\]\.shuffler\.buffer\[0\]\.meta\.padding is 3, but the row's documents leave "
     "0 tokens"),
    (lambda s: _set(_shuffled(s, 1)[0]["payload"]["input_ids"], ["__ndarray__", 2], "!!"),
     r"nodes\[2\]\.shuffler\.buffer\[0\]\.payload\.input_ids\.__ndarray__\[2\] is not base64"),
    (lambda s: _set(_shuffled(s, 1)[0]["payload"]["input_ids"], ["__ndarray__", 1], [15]),
     r"input_ids\.__ndarray__\[2\] holds 64 bytes, but an array of shape \[15\] and dtype "
     "int32 has 60"),
    (lambda s: _set(_nodes(s, 1)[2]["shuffler"]["rng"]["state"], ["inc"], 2),
     r"nodes\[2\]\.shuffler\.rng\.state\.inc is 2, must be odd"),
    (lambda s: _set(s, ["extra"], 1),
     "loader state has the key 'extra', which is not a lane entry"),
    (lambda s: _set(s, ["lane_0", "junk"], 1),
     "loader state 'lane_0': junk is not a field of this state"),
    (lambda s: _set(s, ["lane_9"], {**s["lane_1"], "lane": 9}),
     "loader state has an entry 'lane_9', but this pipeline has lanes 0 to 1"),
])
def test_parts_that_disagree_are_refused(corpus, tokenizer, change, message):
    state = mid_run(build(corpus, tokenizer))
    change(state)
    with pytest.raises(StateMismatchError, match=message):
        build(corpus, tokenizer).load_state_dict(resealed(state))


@dataclass(frozen=True)
class PassRowsSpec(OperatorSpec):
    """A row operator written without checks in its restore."""

    op_name: ClassVar[str] = "test_state_pass_rows"
    title: ClassVar[str] = "pass rows"
    stage: ClassVar[str] = "row"

    def build(self, context: BuildContext) -> PassRows:
        return PassRows(self)


class PassRows(RowOperator):
    def node(self, upstream: Node, lane: int) -> PassRowsNode:
        return PassRowsNode(upstream)


class PassRowsNode(Node):
    def __init__(self, upstream: Node):
        self.upstream, self.rows = upstream, 0

    def next(self) -> Any:
        row = self.upstream.next()
        self.rows += row is not None
        return row

    def snapshot(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def restore(self, state: dict[str, Any]) -> None:
        self.rows = state["rows"]


def test_a_custom_node_that_fails_on_its_state_is_named(corpus, tokenizer):
    state = mid_run(build(corpus, tokenizer, PassRowsSpec()))
    del _nodes(state, 1)[2]["rows"]
    with pytest.raises(StateMismatchError, match=r"loader state 'lane_1': nodes\[2\] does not "
                                                 "fit PassRowsNode: KeyError"):
        build(corpus, tokenizer, PassRowsSpec()).load_state_dict(resealed(state))


def test_check_state_refuses_what_load_would_and_changes_nothing(corpus, tokenizer):
    state = mid_run(build(corpus, tokenizer))
    build(corpus, tokenizer).check_state(state)
    with pytest.raises(StateMismatchError, match="written by a different pipeline: the seed"):
        build(corpus, tokenizer, seed=6).check_state(state)
    damaged = copy.deepcopy(state)
    del damaged["lane_1"]["consumed_global"]
    checked = build(corpus, tokenizer)
    with pytest.raises(StateMismatchError, match="lane_1"):
        checked.check_state(damaged)
    checked.check_state(state)
    first = [digest(batch) for batch in islice(iter(build(corpus, tokenizer)), 3)]
    assert [digest(batch) for batch in islice(iter(checked), 3)] == first


def _first_open_piece(state: dict[str, Any]) -> tuple[int, int]:
    """(lane, bin) of an open packed row in ``state``."""
    for lane in (0, 1):
        bins = _nodes(state, lane)[1]["packer"]["bins"]
        for index, held in enumerate(bins):
            if held:
                return lane, index
    raise AssertionError("no open row in the state")


@pytest.mark.parametrize("bad_id, message", [
    (10**6, r"holds the token id 1000000, but the vocabulary has 4096 ids \(0 to 4095\)"),
    (-7, "holds the token id -7; ids are >= 0"),
])
def test_token_ids_outside_the_vocabulary_are_refused(corpus, tokenizer, bad_id, message):
    """A packed row's saved tokens are ids of the pipeline's vocabulary; an edited id (the
    state sealed again over it) would reach the trainer's embedding and is refused."""
    import base64

    import numpy as np

    state = mid_run(build(corpus, tokenizer))
    lane, index = _first_open_piece(state)
    piece = _nodes(state, lane)[1]["packer"]["bins"][index][0][0]
    dtype, _, data = piece[0]["__ndarray__"]
    tokens = np.frombuffer(base64.b64decode(data), dtype=dtype).copy()
    tokens[len(tokens) // 2] = bad_id
    piece[0]["__ndarray__"][2] = base64.b64encode(tokens.tobytes()).decode()
    where = rf"nodes\[1\]\.packer\.bins\[{index}\]\[0\]\[0\]\[0\]"
    with pytest.raises(StateMismatchError, match=rf"loader state 'lane_{lane}': {where} "
                                                 rf"{message}"):
        build(corpus, tokenizer).load_state_dict(resealed(state))


def test_an_entry_changed_after_it_was_written_is_refused_by_its_checksum(corpus, tokenizer):
    state = mid_run(build(corpus, tokenizer))
    source_state(state, 1, 0)["position"][0] += 1
    with pytest.raises(StateMismatchError, match=r"loader state 'lane_1': sha256 is "
                                                 r"\w{16}\.\.\., but the content hashes to "
                                                 r"\w{16}\.\.\.: the artifact was changed"):
        build(corpus, tokenizer).load_state_dict(state)
    build(corpus, tokenizer).load_state_dict(resealed(state))  # the change itself is valid
