"""Mixture schedules: shares over the job's tokens, their integrals, and where two differ."""

from __future__ import annotations

import math

import pytest

from zephon.errors import ConfigError
from zephon.work.schedule import MixtureSchedule, Stage

TWO_STAGES = [Stage({"web": 0.8, "code": 0.2}, until_tokens=1000),
              Stage({"web": 0.3, "code": 0.3, "math": 0.4}, ramp_tokens=500)]


def test_shares_hold_ramp_linearly_and_hold_again():
    schedule = MixtureSchedule(TWO_STAGES)
    assert schedule.names == ("web", "code", "math")
    assert schedule.shares_at(0) == schedule.shares_at(999) == (0.8, 0.2, 0.0)
    assert schedule.shares_at(1000) == pytest.approx((0.8, 0.2, 0.0))
    assert schedule.shares_at(1250) == pytest.approx((0.55, 0.25, 0.2))
    assert schedule.shares_at(1500) == schedule.shares_at(10**9) == pytest.approx((0.3, 0.3, 0.4))
    assert [schedule.stage_at(t) for t in (0, 999, 1000, 1499, 5000)] == [0, 0, 1, 1, 1]


def test_targets_are_the_exact_integrals_of_the_shares():
    schedule = MixtureSchedule(TWO_STAGES)
    for tokens in (0, 1, 400, 1000, 1200, 1500, 1777, 4000):
        steps = 20_000
        width = tokens / steps
        numeric = [0.0, 0.0, 0.0]
        for i in range(steps):
            for j, share in enumerate(schedule.shares_at((i + 0.5) * width)):
                numeric[j] += share * width
        assert schedule.targets(tokens) == pytest.approx(numeric, rel=1e-6, abs=1e-6)
        assert sum(schedule.targets(tokens)) == pytest.approx(tokens)


def test_a_schedule_that_agrees_on_the_past_differs_only_after_it():
    schedule = MixtureSchedule(TWO_STAGES)
    later = MixtureSchedule([TWO_STAGES[0], Stage({"web": 0.3, "code": 0.3, "math": 0.4},
                                                  until_tokens=3000, ramp_tokens=500),
                             Stage({"web": 0.1, "math": 0.9})])
    assert schedule.differs_before(later, 2999) is None
    found = schedule.differs_before(later, 3000)
    assert (found.stage, found.begins, found.at) == (1, 3000, 3000)
    earlier_ramp = MixtureSchedule([TWO_STAGES[0], Stage(TWO_STAGES[1].weights,
                                                         ramp_tokens=400)])
    assert schedule.differs_before(earlier_ramp, 1000) is None
    found = schedule.differs_before(earlier_ramp, 1001)
    assert (found.stage, found.begins) == (1, 1000)
    moved = MixtureSchedule([Stage({"web": 0.8, "code": 0.2}, until_tokens=900),
                             TWO_STAGES[1]])
    assert schedule.differs_before(moved, 899) is None
    found = schedule.differs_before(moved, 950)
    assert (found.stage, found.begins) == (0, 900)  # apart just after 900
    assert schedule.differs_before(MixtureSchedule(schedule.describe()), math.inf) is None


@pytest.mark.parametrize("stages, message", [
    ([], "at least one stage"),
    ([Stage({"a": 1.0}, until_tokens=10)], "the last stage runs to the end"),
    ([Stage({"a": 1.0}), Stage({"a": 1.0})], "stage 1: until_tokens must be a positive"),
    ([Stage({"a": 1.0}, until_tokens=10), Stage({"a": 1.0}, until_tokens=5), Stage({"a": 1})],
     "stage 2: until_tokens = 5 is not after the stage before it ends"),
    ([Stage({"a": 1.0}, until_tokens=10), Stage({"a": 1.0}, until_tokens=20, ramp_tokens=11),
      Stage({"a": 1})], "stage 2: ramp_tokens = 11 is longer than the stage"),
    ([Stage({"a": 1.0}, ramp_tokens=5)], "the first stage has nothing to ramp from"),
    ([Stage({"a": -1.0})], "weight of 'a' must be a finite number >= 0"),
    ([{"weights": {"a": 1}, "until": 3}], r"unknown key\(s\) \['until'\]"),
])
def test_bad_stages_are_named(stages, message):
    with pytest.raises(ConfigError, match=message):
        MixtureSchedule(stages)
