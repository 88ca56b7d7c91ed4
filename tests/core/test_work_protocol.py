"""A work source written here, with units held in memory, drives the engine through
:mod:`zephon.work.protocol` alone: no files, no tokenizer, no object store."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import numpy as np
import pytest

from tests.kit.state import resealed
from zephon import Pipeline
from zephon.errors import ConfigError, StateMismatchError
from zephon.work import DatasetWork, LaneUnit, MixtureSchedule, Stage, UnitRows, WorkSource

LANES = 4


class MemoryDataset:
    """Units of rows in memory. A dataset read once deals unit ``u`` to lane ``u % L``; a
    repeated one reads an endless sequence of seeded permutations of its units."""

    def __init__(self, name: str, units: list[list[dict[str, Any]]], repeated: bool,
                 seed: int, index: int, lanes: int):
        self.name, self.repeated = name, repeated
        self.units, self.seed, self.index, self.lanes = units, seed, index, lanes
        self.hints: list[list[int]] = []
        self.reads = 0

    def unit_count(self) -> int:
        return len(self.units)

    def unit_at(self, lane: int, k: int) -> LaneUnit | None:
        n = len(self.units)
        position = lane + k * self.lanes
        if not self.repeated:
            return LaneUnit(0, position, position, len(self.units[position])) \
                if position < n else None
        epoch, i = divmod(position, n)
        unit = int(np.random.default_rng([self.seed, self.index, epoch]).permutation(n)[i])
        return LaneUnit(epoch, unit, unit, len(self.units[unit]))

    def units_of_lane(self, lane: int) -> int | None:
        return None if self.repeated else len(range(lane, len(self.units), self.lanes))

    def lane_units(self, lane: int) -> list[int]:
        return list(range(len(self.units))) if self.repeated else \
            list(range(lane, len(self.units), self.lanes))

    def row_order(self, unit: LaneUnit, n: int) -> np.ndarray:
        return np.random.default_rng([self.seed, self.index, unit.epoch, unit.index]
                                     ).permutation(n)

    def read(self, index: int, columns) -> UnitRows:
        self.reads += 1
        rows = self.units[index]
        names = list(columns) if columns is not None else list(rows[0]) if rows else []
        return UnitRows({c: [r[c] for r in rows] for c in names}, list(range(len(rows))),
                        lambda key: f"{self.name} unit {index} row {key}", index)

    def fetch_ahead(self, units) -> None:
        self.hints.append([u.index for u in units])

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.units).encode()).hexdigest()[:16]

    def skipped_files(self) -> list[Any]:
        return []


class MemoryWorkSource:
    """Datasets of in-memory units, mixed by documents."""

    def __init__(self, data: dict[str, list[list[dict[str, Any]]]],
                 weights: dict[str, float], *, seed: int = 0, repeat: bool = True,
                 on_exhausted: str = "stop"):
        self.data, self.seed, self.repeat = data, seed, repeat
        self.schedule = MixtureSchedule([Stage(weights)])
        self.on_exhausted = on_exhausted
        self.unused: list[str] = []
        self._work: dict[int, list[MemoryDataset]] = {}

    @property
    def by_tokens(self) -> bool:
        return False

    def names(self) -> list[str]:
        return list(self.data)

    def work(self, lanes: int) -> list[MemoryDataset]:
        if lanes not in self._work:
            self._work[lanes] = [MemoryDataset(name, units, self.repeat, self.seed, i, lanes)
                                 for i, (name, units) in enumerate(self.data.items())]
        return self._work[lanes]

    def fingerprint(self) -> dict[str, Any]:
        return {"data": hashlib.sha256(json.dumps(self.data).encode()).hexdigest()[:16],
                "seed": self.seed, "repeat": self.repeat, "on_exhausted": self.on_exhausted}

    def bound(self, io_options) -> MemoryWorkSource:
        return self


def corpus(seed: int = 0) -> dict[str, list[list[dict[str, Any]]]]:
    """Two datasets: 12 units of 5 rows and 6 units of 3 rows (the last one short)."""
    rng = np.random.default_rng(seed)
    web = [[{"id": f"web-{u}-{r}", "n": int(rng.integers(1000))} for r in range(5)]
           for u in range(12)]
    code = [[{"id": f"code-{u}-{r}", "n": int(rng.integers(1000))}
             for r in range(3 if u < 5 else 2)] for u in range(6)]
    return {"web": web, "code": code}


def pipeline(source: WorkSource, world: int = 1, rank: int = 0) -> Pipeline:
    return Pipeline(source).options(lanes=LANES, dp_rank=rank, dp_world_size=world,
                                    prefetch=0).batch(2)


def steps_of(iterators: list, steps: int) -> list[list[str]]:
    """``steps`` steps of the ranks' iterators (one microbatch a lane each step), each step's
    microbatches as ids in global order."""
    world = len(iterators)
    out = []
    for _ in range(steps):
        step = []
        for iterator in iterators:
            for _ in range(LANES // world):
                batch = next(iterator)
                step.append((batch.index * LANES + batch.lane,
                             [r.payload["id"] for r in batch.records]))
        out.append([ids for _, ids in sorted(step)])
    return out


def global_batches(source_factory, world: int, steps: int) -> list[list[str]]:
    """The first ``steps`` steps of a run at ``world`` ranks."""
    return steps_of([iter(pipeline(source_factory(), world, r)) for r in range(world)], steps)


def test_the_memory_source_meets_the_protocol():
    source = MemoryWorkSource(corpus(), {"web": 3, "code": 1})
    assert isinstance(source, WorkSource)
    assert all(isinstance(w, DatasetWork) for w in source.work(LANES))


def test_an_in_memory_work_source_drives_the_engine():
    source = MemoryWorkSource(corpus(), {"web": 3, "code": 1})
    taken = [r.payload for batch in _take(pipeline(source), 40) for r in batch.records]
    everything = {row["id"]: row for units in corpus().values() for u in units for row in u}
    assert all(everything[p["id"]] == {"id": p["id"], "n": p["n"]} for p in taken)
    share = sum(p["id"].startswith("web") for p in taken) / len(taken)
    assert abs(share - 0.75) < 0.03
    assert all(w.reads > 0 for w in source.work(LANES))


def test_global_batches_are_the_same_at_every_data_parallel_size():
    reference = global_batches(lambda: MemoryWorkSource(corpus(), {"web": 3, "code": 1}), 1, 8)
    for world in (2, 4):
        assert global_batches(lambda: MemoryWorkSource(corpus(), {"web": 3, "code": 1}),
                              world, 8) == reference


@pytest.mark.parametrize("stop, world_before, world_after", [(3, 2, 1), (5, 1, 4), (1, 4, 2)])
def test_resume_is_exact_across_data_parallel_sizes(stop, world_before, world_after):
    def source() -> MemoryWorkSource:
        return MemoryWorkSource(corpus(), {"web": 3, "code": 1}, seed=5)

    reference = global_batches(source, 1, stop + 6)
    before = [pipeline(source(), world_before, r) for r in range(world_before)]
    assert steps_of([iter(p) for p in before], stop) == reference[:stop]
    state: dict[str, Any] = {}
    for p in before:
        state.update(p.state_dict())
    after = [pipeline(source(), world_after, r) for r in range(world_after)]
    for p in after:
        p.load_state_dict(state)
    assert steps_of([iter(p) for p in after], 6) == reference[stop:]


def test_a_dataset_read_once_gives_each_row_once_and_counts_the_rest():
    data = corpus()
    source = MemoryWorkSource(data, {"web": 1, "code": 1}, repeat=False, on_exhausted="drain")
    p = pipeline(source)
    handed = [r.payload["id"] for batch in p for r in batch.records]
    assert len(handed) == len(set(handed))
    total = sum(len(u) for units in data.values() for u in units)
    report = p.report()
    assert len(handed) + report.leftover["rows"] + report.dropped["rows"] == total
    hinted = [i for w in source.work(LANES) for hint in w.hints for i in hint]
    assert hinted, "the lanes told the source which units come next"


def test_a_state_outside_the_units_is_refused_before_any_read():
    source = MemoryWorkSource(corpus(), {"web": 3, "code": 1})
    first = pipeline(source)
    _take(first, 3)
    state = copy.deepcopy(first.state_dict())
    position = state["lane_0"]["lane_state"]["nodes"][0]["sources"][0]["position"]
    position[1] = 99  # a row past the 5 rows of the unit (the plan knows its rows)
    fresh = MemoryWorkSource(corpus(), {"web": 3, "code": 1})
    with pytest.raises(StateMismatchError, match=r"position\[1\]"):
        pipeline(fresh).load_state_dict(resealed(state))
    assert all(w.reads == 0 for w in fresh.work(LANES))


def test_a_state_of_other_data_is_refused():
    first = pipeline(MemoryWorkSource(corpus(), {"web": 3, "code": 1}))
    _take(first, 2)
    with pytest.raises(StateMismatchError, match="work_source"):
        pipeline(MemoryWorkSource(corpus(seed=1), {"web": 3, "code": 1})).load_state_dict(
            first.state_dict())


def test_an_object_that_is_not_a_work_source_is_refused_by_name():
    class Half:
        seed = 0

        def names(self):
            return ["a"]

    with pytest.raises(ConfigError, match=r"Half is not a work source: it lacks \['schedule'"):
        Pipeline(Half())


def _take(p: Pipeline, n: int) -> list:
    iterator = iter(p)
    return [next(iterator) for _ in range(n)]

