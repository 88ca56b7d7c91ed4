"""A user-written operator (tests/core/toy_ops.py) plugs into the chain, the fingerprint, the
report, exact resume and recipes without any change to Zephon."""

from __future__ import annotations

import pickle

import pytest

from tests.core.toy_ops import DropShortSpec, ShoutSpec
from tests.kit.elastic import LANES, build, digest, merged_state, run, stream
from zephon import Pipeline, StateMismatchError
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.recipe import DataRecipe
from zephon.work import StaticMixtureWorkSource


def with_toy_ops(base: Pipeline, min_tokens: int = 60, shout: bool = True) -> Pipeline:
    """``base``'s operators with shout (optional) before tokenize and drop_short after it."""
    pipeline = Pipeline(base.work_source)
    for spec in base.operators:
        if spec.op_name == "tokenize":
            if shout:
                pipeline = pipeline.apply(ShoutSpec())
            pipeline = pipeline.apply(spec).apply(DropShortSpec(min_tokens))
        else:
            pipeline = pipeline.apply(spec)
    return pipeline


def test_toy_operators_change_the_data_and_are_counted(two_datasets, tokenizer_dir):
    plain = build(two_datasets, tokenizer_dir, repeat=False,
                  on_exhausted="drain").options(lanes=LANES)
    toy = with_toy_ops(plain, min_tokens=40, shout=False).options(lanes=LANES)
    plain_batches = [digest(b) for b in plain]
    toy_batches = [digest(b) for b in toy]
    assert toy_batches and toy_batches != plain_batches
    shouted = with_toy_ops(plain, min_tokens=1).options(lanes=LANES)
    assert [digest(b) for b in shouted] != plain_batches
    report = toy.report()
    dropped = sum(d.skipped.get("too_short", 0) for d in report.datasets)
    assert dropped > 0
    # One pass over everything: the documents kept and the ones dropped add up to all of them.
    assert sum(d.documents for d in report.datasets) + dropped == sum(
        d.documents for d in plain.report().datasets)


@pytest.mark.parametrize("world", [1, 2])
def test_toy_operators_resume_exactly(two_datasets, tokenizer_dir, world):
    base = with_toy_ops(build(two_datasets, tokenizer_dir))
    reference = run(base, world, steps=8)
    pipelines, first = stream(base, world, 0, 3)
    state = merged_state(pipelines)
    pipelines, rest = stream(with_toy_ops(build(two_datasets, tokenizer_dir)), world, 0, 5,
                             state)
    assert first + rest == reference
    # The other size resumes the same state to the same batches too.
    other = 3 - world
    _, rest_other = stream(with_toy_ops(build(two_datasets, tokenizer_dir)), other, 0, 5, state)
    assert first + rest_other == reference


def test_toy_operator_options_are_in_the_fingerprint(two_datasets, tokenizer_dir):
    pipeline = with_toy_ops(build(two_datasets, tokenizer_dir), 60).options(lanes=2)
    next(iter(pipeline))
    state = pickle.loads(pickle.dumps(pipeline.state_dict()))
    changed = with_toy_ops(build(two_datasets, tokenizer_dir), 61).options(lanes=2)
    with pytest.raises(StateMismatchError, match="drop_short options changed"):
        changed.load_state_dict(state)
    without = build(two_datasets, tokenizer_dir).options(lanes=2)
    with pytest.raises(StateMismatchError, match="operators changed"):
        without.load_state_dict(state)


def test_toy_operator_from_a_recipe(two_datasets, tokenizer_dir):
    def recipe(ops):
        return DataRecipe.from_dict({
            "lanes": 2,
            "datasets": [{"name": n, "path": str(p)} for n, p in two_datasets.items()],
            "tokenize": {"tokenizer": tokenizer_dir},
            "ops": ops,
        })

    by_path = recipe([{"op": "tests.core.toy_ops:DropShortSpec", "min_tokens": 40,
                       "after_tokenize": True}])
    by_name = recipe([{"op": "drop_short", "min_tokens": 40, "after_tokenize": True}])
    batches = [[digest(b) for b in r.build(seq_len=64, microbatch_size=2)]
               for r in (by_path, by_name)]
    assert batches[0] == batches[1] and batches[0]
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['min_tokenz'\] in \[ops\]"):
        recipe([{"op": "drop_short", "min_tokenz": 4, "after_tokenize": True}])
    with pytest.raises(ConfigError, match="min_tokens = '4' in \\[ops\\] must be an integer"):
        recipe([{"op": "drop_short", "min_tokens": "4", "after_tokenize": True}])
    with pytest.raises(ConfigError, match="unknown operator 'drop_shrot'"):
        recipe([{"op": "drop_shrot"}])
    with pytest.raises(ConfigError, match="works on token ids"):
        recipe([{"op": "drop_short"}]).build(seq_len=64, microbatch_size=2)


def test_token_operator_before_tokenize_is_refused(two_datasets, tokenizer_dir):
    source = StaticMixtureWorkSource([Dataset.from_path("s", two_datasets["short"])])
    with pytest.raises(ConfigError, match="works on token ids"):
        iter(Pipeline(source).apply(DropShortSpec()).tokenize(tokenizer_id=tokenizer_dir)
             .batch(2))
