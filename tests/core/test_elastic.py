"""Lanes, elastic determinism and exact resume, token for token."""

from __future__ import annotations

import pickle
import random

import pytest

from tests.kit.elastic import LANES, build, digest, merged_state, rank_pipelines, run, stream
from zephon import Pipeline, StateMismatchError
from zephon.errors import ConfigError


def test_global_batches_identical_for_every_dp_size(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    reference = run(base, 1, steps=6)
    assert [m for m, _ in reference[0]] == list(range(8))
    for world in (2, 4, 8):
        assert run(base, world, steps=6) == reference, f"W={world} differs"


def test_steps_smaller_than_lane_count(two_datasets, tokenizer_dir):
    """Global batch of 4 microbatches with 8 lanes: still identical for W in {1, 2, 4}."""
    base = build(two_datasets, tokenizer_dir)
    reference = run(base, 1, steps=5, global_batch=4)
    for world in (2, 4):
        assert run(base, world, steps=5, global_batch=4) == reference


def test_prefetch_depth_changes_nothing(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    reference = run(base, 2, steps=4, prefetch=0)
    for prefetch in (1, 7):
        assert run(base, 2, steps=4, prefetch=prefetch) == reference


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resume_at_random_points_and_sizes(two_datasets, tokenizer_dir, seed):
    rng = random.Random(seed)
    base = build(two_datasets, tokenizer_dir)
    total = 14
    reference = run(base, 1, steps=total)
    produced: list = []
    state = None
    world = rng.choice([1, 2, 4, 8])
    while len(produced) < total:
        chunk = min(rng.randint(1, 5), total - len(produced))
        pipelines, out = stream(base, world, 0, chunk, state)
        produced += out
        state = merged_state(pipelines)
        world = rng.choice([1, 2, 4, 8])
    assert produced == reference


def test_second_resume_right_after_first(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    reference = run(base, 2, steps=6)
    pipelines, first = stream(base, 2, 0, 2)
    state = merged_state(pipelines)
    # Resume, take a state at once (nothing consumed), resume again from it.
    pipelines, _ = stream(base, 4, 0, 0, state)
    state_again = merged_state(pipelines)
    pipelines, rest = stream(base, 1, 0, 4, state_again)
    assert first + rest == reference


def test_restore_into_fresh_pipeline_object(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    reference = run(base, 1, steps=5)
    pipelines, first = stream(base, 1, 0, 2)
    state = merged_state(pipelines)
    fresh = build(two_datasets, tokenizer_dir)  # built from scratch, nothing shared
    pipelines, rest = stream(fresh, 2, 0, 3, state)
    assert first + rest == reference


def one_pass_stream(base, world=1):
    pipelines = rank_pipelines(base, world)
    return [[digest(b) for b in p] for p in pipelines]


def test_resume_after_several_epochs_and_at_epoch_end(two_datasets, tokenizer_dir):
    """Repeat mode: many epochs of the small datasets; resume points cross epoch ends."""
    base = build(two_datasets, tokenizer_dir, shuffle=0, microbatch=4, max_length=129)
    steps = 40
    reference = run(base, 1, steps=steps)
    pipelines, _ = stream(base, 1, 0, steps)
    epochs = [c["epoch"] for p in pipelines for lane in p.state_dict().values()
              for c in lane["lane_state"]["nodes"][0]["sources"]]
    assert max(epochs) >= 2, "the test should run through several epochs"
    produced, state = [], None
    for cut in (3, 11, 9, 17):
        pipelines, out = stream(base, 2 if len(produced) % 2 else 4, 0, cut, state)
        produced += out
        state = merged_state(pipelines)
    assert produced == reference


def test_resume_exactly_at_end_of_one_pass(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir, repeat=False, on_exhausted="drain")
    pipeline = base.options(lanes=LANES, prefetch=2)
    everything = [digest(b) for b in pipeline]
    state = pipeline.state_dict()
    assert pipeline.report().finished
    again = base.options(lanes=LANES)
    again.load_state_dict(state)
    assert list(again) == []
    # Resume one batch before the end: exactly the last batch comes out.
    pipeline = base.options(lanes=LANES, prefetch=0)
    iterator = iter(pipeline)
    for _ in range(len(everything) - 1):
        next(iterator)
    state = pipeline.state_dict()
    tail = base.options(lanes=LANES)
    tail.load_state_dict(state)
    assert [digest(b) for b in tail] == everything[-1:]


def test_state_size_does_not_grow(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    pipeline = base.options(lanes=LANES, prefetch=2)
    iterator = iter(pipeline)
    sizes = []
    for step in range(60):
        next(iterator)
        if step % 20 == 19:
            sizes.append(len(pickle.dumps(pipeline.state_dict())))
    assert max(sizes) < 1.5 * min(sizes)


def test_token_shares_within_one_percent(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir, max_length=129)
    pipeline = base.options(lanes=1)
    iterator = iter(pipeline)
    for _ in range(150):  # 300 rows of 129 tokens
        next(iterator)
    report = pipeline.report()
    tokens = {d.name: d.tokens for d in report.datasets}
    docs = {d.name: d.documents for d in report.datasets}
    mean_short = tokens["short"] / docs["short"]
    mean_long = tokens["long"] / docs["long"]
    assert mean_long / mean_short > 4
    for d in report.datasets:
        assert abs(d.realized_share - d.target_share) < 0.01, report


def test_document_mixing_by_samples(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir, by_tokens=False)
    pipeline = base.options(lanes=1)
    iterator = iter(pipeline)
    for _ in range(100):
        next(iterator)
    report = pipeline.report()
    assert report.mix_by == "documents"
    for d in report.datasets:
        assert abs(d.realized_share - d.target_share) < 0.02, report


def test_refuses_dp_size_not_dividing_lanes(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"8 lanes cannot be shared by 3 .* must divide the "
                                          r"lanes \(\[1, 2, 4, 8\]\)"):
        iter(base.options(lanes=8, dp_rank=0, dp_world_size=3))


def test_lanes_default_to_world_size_with_warning(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    with pytest.warns(UserWarning, match="changing the number of data-parallel ranks"):
        pipeline = base.options(dp_rank=0, dp_world_size=2)
        iter(pipeline)
    assert pipeline.lanes == 2


def saved_state(two_datasets, tokenizer_dir, **kwargs):
    pipeline = build(two_datasets, tokenizer_dir, **kwargs).options(lanes=LANES)
    iterator = iter(pipeline)
    next(iterator)
    return pipeline.state_dict()


def test_refuses_changed_lanes(two_datasets, tokenizer_dir):
    state = saved_state(two_datasets, tokenizer_dir)
    other = build(two_datasets, tokenizer_dir).options(lanes=4)
    with pytest.raises(StateMismatchError, match="the lane count changed"):
        other.load_state_dict(state)


def test_refuses_changed_recipe(two_datasets, tokenizer_dir):
    state = saved_state(two_datasets, tokenizer_dir)
    other = build(two_datasets, tokenizer_dir, max_length=33).options(lanes=LANES)
    with pytest.raises(StateMismatchError, match="packing options changed"):
        other.load_state_dict(state)
    other = build(two_datasets, tokenizer_dir, seed=8).options(lanes=LANES)
    with pytest.raises(StateMismatchError, match="seed changed"):
        other.load_state_dict(state)
    other = build(two_datasets, tokenizer_dir, weights=(0.5, 0.5)).options(lanes=LANES)
    with pytest.raises(StateMismatchError, match=r"nodes\[0\]\.schedule is the mixture the run "
                       r"trained with, and stage 1 of this one differs from it from job token "
                       r"0 \(at 0: shares \{short: 0\.5, long: 0\.5\} here, \{short: 0\.6, "
                       r"long: 0\.4\} in the run\)"):
        other.load_state_dict(state)


def test_refuses_changed_tokenizer(two_datasets, tokenizer_dir, tmp_path):
    from zephon.demo.assets import make_documents, train_tokenizer

    state = saved_state(two_datasets, tokenizer_dir)
    other_tok = train_tokenizer(make_documents(50, seed=9), tmp_path / "tok2", vocab_size=600)
    source = build(two_datasets, tokenizer_dir).work_source
    other = (Pipeline(source).tokenize(tokenizer_id=other_tok).pack_flat(65).shuffle(16)
             .batch(2).options(lanes=LANES))
    with pytest.raises(StateMismatchError, match="tokenizer"):
        other.load_state_dict(state)


def test_refuses_other_dataset_revision(two_datasets, tokenizer_dir):
    state = saved_state(two_datasets, tokenizer_dir)
    extra = two_datasets["long"] / "part-9.jsonl"
    extra.write_text('{"text": "a new file appeared"}\n')
    other = build(two_datasets, tokenizer_dir).options(lanes=LANES)
    with pytest.raises(StateMismatchError, match="datasets or their files"):
        other.load_state_dict(state)


def test_refuses_state_missing_own_lanes(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    pipelines, _ = stream(base, 2, 0, 1)
    only_rank0 = pipelines[0].state_dict()
    single = base.options(lanes=LANES)
    with pytest.raises(StateMismatchError, match="lacks"):
        single.load_state_dict(only_rank0)


def test_token_estimation_measures_sizes(two_datasets, tokenizer_dir):
    pipeline = build(two_datasets, tokenizer_dir, repeat=False, on_exhausted="drain",
                     shuffle=0).options(lanes=1)
    estimates = {e.name: e for e in pipeline.estimate()}
    list(pipeline)
    report = {d.name: d for d in pipeline.report().datasets}
    assert estimates["short"].documents == report["short"].documents == 150
    for name in ("short", "long"):
        true_tokens = report[name].tokens
        assert abs(estimates[name].tokens - true_tokens) / true_tokens < 0.25, name
    assert estimates["long"].tokens_per_document > 4 * estimates["short"].tokens_per_document


DIGEST_SCRIPT = r"""
import hashlib, sys
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation
short, long, tokenizer = sys.argv[1:4]
source = StaticMixtureWorkSource(
    [Dataset.from_path("short", short), Dataset.from_path("long", long)],
    MixtureSpec({"short": 0.6, "long": 0.4}), seed=7, token_estimation=TokenEstimation(),
    unit_bytes=4096, on_exhausted="drain")
pipeline = (Pipeline(source).options(lanes=4, prefetch=3).tokenize(tokenizer_id=tokenizer,
            batch_size=17).pack_flat(65).shuffle(8).batch(2))
h = hashlib.sha256()
for batch in pipeline:
    for record in batch.records:
        h.update(record.payload["input_ids"].tobytes())
print(h.hexdigest())
"""


def test_tokenizer_thread_count_changes_nothing(two_datasets, tokenizer_dir, tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "digest.py"
    script.write_text(DIGEST_SCRIPT)
    digests = set()
    for threads in ("1", "2", "4"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "true"}
        done = subprocess.run([sys.executable, str(script), str(two_datasets["short"]),
                               str(two_datasets["long"]), tokenizer_dir], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1


def test_state_is_plain_data(two_datasets, tokenizer_dir):
    """Checkpoints hold no Zephon objects and no numpy: they load without importing zephon's
    classes, through json and through torch.load(weights_only=True), and resume exactly."""
    import io
    import json

    import torch

    pipeline = build(two_datasets, tokenizer_dir).options(lanes=2)
    iterator = iter(pipeline)
    for _ in range(3):
        next(iterator)
    state = pipeline.state_dict()
    rest = [digest(b) for _, b in zip(range(4), iterator, strict=False)]

    class PlainOnly(pickle.Unpickler):
        def find_class(self, module, name):
            raise AssertionError(f"checkpoint references {module}.{name}")

    PlainOnly(io.BytesIO(pickle.dumps(state))).load()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    via_torch = torch.load(buffer, weights_only=True)
    via_json = json.loads(json.dumps(state))
    nodes = via_json["lane_0"]["lane_state"]["nodes"]
    shuffler = next(node["shuffler"] for node in nodes if "shuffler" in node)
    assert shuffler["buffer"] and "__ndarray__" in shuffler["buffer"][0]["payload"]["input_ids"]
    for loaded in (via_torch, via_json):
        resumed = build(two_datasets, tokenizer_dir).options(lanes=2)
        resumed.load_state_dict(loaded)
        assert [digest(b) for _, b in zip(range(4), resumed, strict=False)] == rest


def test_superseded_iterator_stops_and_leaves_state_alone(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir)
    pipeline = base.options(lanes=2, prefetch=2)
    old = iter(pipeline)
    first = [digest(next(old)) for _ in range(3)]
    new = iter(pipeline)  # continues from what was consumed; the old iterator is retired
    assert list(old) == []
    rest = [digest(next(new)) for _ in range(3)]
    reference = base.options(lanes=2, prefetch=0)
    assert [digest(b) for _, b in zip(range(6), reference, strict=False)] == first + rest
