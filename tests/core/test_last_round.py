"""The last round's hand-out: groups of one position a rank, complete groups only."""

from __future__ import annotations

from zephon.engine.last_round import groups
from zephon.sample_batch import SampleBatch


def batches(n: int) -> list[SampleBatch]:
    return [SampleBatch([], lane=i % 3, index=i // 3) for i in range(n)]


def test_complete_groups_from_the_first_position_then_the_rest() -> None:
    out = list(groups(iter(batches(11)), first=2, size=4, start=80))
    assert [[b.position for b in g] for g in out[:-1]] == [[82, 83, 84, 85], [86, 87, 88, 89]]
    assert [b.position for b in out[-1][0]] == [90]  # fewer than 4: left over


def test_one_rank_takes_every_position() -> None:
    out = list(groups(iter(batches(5)), first=0, size=1, start=0))
    assert [g[0].position for g in out[:-1]] == [0, 1, 2, 3, 4]
    assert out[-1] == ([],)


def test_positions_before_the_first_are_skipped_not_handed() -> None:
    out = list(groups(iter(batches(3)), first=3, size=2, start=8))
    assert out == [([],)]
