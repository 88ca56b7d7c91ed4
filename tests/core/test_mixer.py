"""The mixer node over dataset sources: exact deficits, stop or drain, counts per dataset."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.engine.mixer import DeficitMixer, MixNode, MixTargets
from zephon.records import Doc
from zephon.work.schedule import MixtureSchedule, Stage


def static(*weights: float, names: str | tuple[str, ...] = "ab") -> MixtureSchedule:
    """A one-stage schedule of ``weights`` over datasets named by the letters of ``names``."""
    return MixtureSchedule([Stage(dict(zip(names, weights)))])


def mixer(*weights: float) -> DeficitMixer:
    return DeficitMixer(MixTargets(static(*weights), "ab", lanes=1))


class FakeSource:
    def __init__(self, name, lengths):
        self.name, self.lengths, self.i, self.skipped = name, lengths, 0, {}

    def next(self):
        doc = self.peek()
        self.i += doc is not None
        return doc

    def peek(self):
        if self.i >= len(self.lengths):
            return None
        return Doc(np.zeros(self.lengths[self.i], np.int32), f"{self.name}{self.i + 1}",
                   self.name)

    def snapshot(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]


def drain(node):
    out = []
    while (doc := node.next()) is not None:
        out.append(doc)
    return out


def test_token_shares_stay_within_one_document():
    node = MixNode([FakeSource("a", [10] * 100), FakeSource("b", [50] * 100)], static(0.5, 0.5),
                   by_tokens=True, on_exhausted="stop")
    tokens = {"a": 0, "b": 0}
    for _ in range(60):
        doc = node.next()
        tokens[doc.dataset] += len(doc.tokens)
        assert abs(tokens["a"] - tokens["b"]) <= 50
    assert node.snapshot()["stats"]["tokens"] == tokens


def test_by_tokens_the_next_documents_decide_and_the_lane_stays_close_to_its_target():
    """One long document next to short ones: taking it as soon as its dataset is below
    target (the deficit rule) overshoots by most of it; looking at the next documents keeps
    every prefix within half of the longest document."""
    lengths = {"short": [20, 30, 10, 40] * 60, "long": [400, 250, 500] * 30}
    node = MixNode([FakeSource(n, v) for n, v in lengths.items()],
                   static(0.7, 0.3, names=("short", "long")),
                   by_tokens=True, on_exhausted="stop")
    tokens = {"short": 0, "long": 0}
    worst_after_start = 0.0
    for step in range(200):
        doc = node.next()
        tokens[doc.dataset] += len(doc.tokens)
        total = sum(tokens.values())
        if step >= 2:
            worst_after_start = max(worst_after_start, abs(tokens["long"] - 0.3 * total))
    assert worst_after_start <= 500 / 2 + 40
    deficit = mixer(0.7, 0.3)
    assert deficit.closest([20, 400]) == 0  # the long one would overshoot the lane
    deficit.record(0, 2000)
    assert deficit.closest([20, 400]) == 1  # now it brings the lane closest to 0.3


@pytest.mark.parametrize("policy, expected", [("stop", 2 * 3), ("drain", 3 + 10)])
def test_stop_or_drain_when_a_dataset_ends(policy, expected):
    node = MixNode([FakeSource("a", [1] * 3), FakeSource("b", [1] * 10)], static(0.5, 0.5),
                   by_tokens=False, on_exhausted=policy)
    assert len(drain(node)) == expected
    assert node.next() is None and node.snapshot()["ended"]


def test_restore_continues_the_same_choices():
    def make():
        return MixNode([FakeSource("a", [3, 9, 1] * 10), FakeSource("b", [5] * 30)],
                       static(0.3, 0.7), by_tokens=True, on_exhausted="drain")

    node = make()
    head = [d.doc_id for d in (node.next() for _ in range(11))]
    saved = node.snapshot()
    rest = [d.doc_id for d in drain(node)]
    again = make()
    again.restore(saved)
    assert [d.doc_id for d in drain(again)] == rest
    assert len(head + rest) == 60


def test_deficit_mixer_ties_go_to_the_lowest_index():
    chooser = mixer(1, 1)
    assert chooser.choose() == 0
    chooser.record(0, 1)
    assert chooser.choose() == 1
