"""Resume from any consumed count at any size dividing the lanes, token for token.

Random schedules of 2-4 resumes: each segment picks a data-parallel size W in {1, 2, 4, 8}
(L = 8 lanes), consumes a random number of steps of W microbatches, checkpoints (the ranks'
states merged, through JSON) and hands over; consumed counts are therefore arbitrary, not
multiples of the next W. Every schedule must reproduce the uninterrupted run's global
microbatches exactly, for token and document mixing and all three packing algorithms.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.kit.elastic import digest
from zephon import Pipeline
from zephon.io import Dataset
from zephon.text.tokenizer import load_tokenizer
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

LANES = 8
SCHEDULES_PER_CONFIG = 34  # x 6 configurations: 204 schedules
CONFIGS = [(by_tokens, algorithm) for by_tokens in (True, False)
           for algorithm in ("wrap", "first_fit", "best_fit")]


class Fixture:
    def __init__(self, paths, tokenizer, by_tokens, algorithm):
        self.datasets = [Dataset.from_path("short", paths["short"]),
                         Dataset.from_path("long", paths["long"])]
        self.source = StaticMixtureWorkSource(
            self.datasets, MixtureSpec({"short": 0.6, "long": 0.4}), seed=11,
            token_estimation=TokenEstimation() if by_tokens else None, repeat=True,
            unit_bytes=4096)
        self.tokenizer = tokenizer
        self.algorithm = algorithm

    def rank(self, rank: int, world: int) -> Pipeline:
        return (Pipeline(self.source)
                .options(lanes=LANES, dp_rank=rank, dp_world_size=world, prefetch=0)
                .tokenize(tokenizer=self.tokenizer).pack_flat(33, self.algorithm).shuffle(3)
                .batch(2))


def segment(fixture: Fixture, world: int, steps: int, state):
    """Consume ``steps`` steps of ``world`` microbatches; (global index, digest) and state."""
    pipelines = [fixture.rank(r, world) for r in range(world)]
    if state is not None:
        for p in pipelines:
            p.load_state_dict(state)
    iterators = [iter(p) for p in pipelines]
    out = []
    for _ in range(steps):
        for iterator in iterators:
            batch = next(iterator)
            out.append((batch.index * LANES + batch.lane, digest(batch)))
    merged = {}
    for p in pipelines:
        merged.update(p.state_dict())
    return sorted(out), json.loads(json.dumps(merged))


@pytest.mark.slow
@pytest.mark.parametrize("by_tokens, algorithm", CONFIGS)
def test_random_resume_schedules(two_datasets, tokenizer_dir, by_tokens, algorithm):
    fixture = Fixture(two_datasets, load_tokenizer(tokenizer_dir), by_tokens, algorithm)
    reference, _ = segment(fixture, 1, 40, None)
    assert [m for m, _ in reference] == list(range(40))
    rng = random.Random(f"{by_tokens}-{algorithm}")
    odd_starts = 0
    for _ in range(SCHEDULES_PER_CONFIG):
        produced, state = [], None
        for _ in range(rng.randint(2, 4)):
            world = rng.choice([1, 2, 4, 8])
            steps = rng.randint(1, max(1, 8 // world))
            if len(produced) + steps * world > len(reference):
                break
            odd_starts += bool(len(produced) % world)
            out, state = segment(fixture, world, steps, state)
            assert [m for m, _ in out] == list(range(len(produced), len(produced) + len(out)))
            produced += out
        assert produced == reference[:len(produced)]
    assert odd_starts > 0  # some resumes started at counts the new size does not divide


def test_resume_at_a_size_that_does_not_divide_the_count(two_datasets, tokenizer_dir):
    """10 microbatches consumed at W=2, resumed at W=4: ranks 2 and 3 take 10 and 11."""
    fixture = Fixture(two_datasets, load_tokenizer(tokenizer_dir), True, "wrap")
    reference, _ = segment(fixture, 1, 18, None)
    first, state = segment(fixture, 2, 5, None)
    pipelines = [fixture.rank(r, 4) for r in range(4)]
    for p in pipelines:
        p.load_state_dict(state)
    firsts = [next(iter(p)) for p in pipelines]
    assert [b.index * LANES + b.lane for b in firsts] == [12, 13, 10, 11]
    rest, _ = segment(fixture, 4, 2, state)
    assert first + rest == reference
