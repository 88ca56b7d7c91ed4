"""Two-dataset pipelines and their global batches at any data-parallel size: ``build`` a
pipeline, ``run`` it at ``W`` simulated ranks, ``stream`` from a merged state, and compare
steps as sorted ``(global microbatch, digest)`` pairs."""

from __future__ import annotations

import hashlib
import pickle

from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

LANES = 8


def build(paths, tokenizer_dir, *, repeat=True, shuffle=16, seed=7, max_length=65,
          microbatch=2, by_tokens=True, weights=(0.6, 0.4), **work) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_path("short", paths["short"]), Dataset.from_path("long", paths["long"])],
        MixtureSpec(dict(zip(["short", "long"], weights, strict=True))), seed=seed,
        token_estimation=TokenEstimation() if by_tokens else None, repeat=repeat,
        unit_bytes=4096, **work)
    pipeline = (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(max_length, "wrap"))
    if shuffle:
        pipeline = pipeline.shuffle(shuffle)
    return pipeline.batch(microbatch)


def digest(batch) -> str:
    h = hashlib.sha256()
    for record in batch.records:
        h.update(record.payload["input_ids"].tobytes())
    return h.hexdigest()[:16]


def rank_pipelines(base: Pipeline, world: int, prefetch: int = 2) -> list[Pipeline]:
    return [base.options(lanes=LANES, dp_rank=r, dp_world_size=world, prefetch=prefetch)
            for r in range(world)]


def take_steps(pipelines, iterators, steps: int, per_rank: int) -> list[list[str]]:
    """Global batches: for each step, the sorted (global index, digest) of all ranks' batches."""
    out = []
    for _ in range(steps):
        step = []
        for iterator in iterators:
            for _ in range(per_rank):
                batch = next(iterator)
                step.append((batch.global_microbatch(LANES), digest(batch)))
        out.append(sorted(step))
    return out


def run(base, world, steps, global_batch=8, prefetch=2):
    pipelines = rank_pipelines(base, world, prefetch)
    iterators = [iter(p) for p in pipelines]
    return take_steps(pipelines, iterators, steps, global_batch // world)


def merged_state(pipelines) -> dict:
    state = {}
    for p in pipelines:
        state.update(pickle.loads(pickle.dumps(p.state_dict())))
    return state


def stream(base, world, skip_steps, steps, state=None, global_batch=8):
    pipelines = rank_pipelines(base, world)
    if state is not None:
        for p in pipelines:
            p.load_state_dict(state)
    iterators = [iter(p) for p in pipelines]
    out = take_steps(pipelines, iterators, steps, global_batch // world)
    return pipelines, out
