"""The kit's batch check: real training batches pass, and each kind of damage is named."""

from __future__ import annotations

import pytest

from tests.conftest import write_jsonl
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.integration import check_training_batch, training_batch_problems
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

OPTIONS = {"return_labels": True, "return_padding_mask": True, "return_num_valid_tokens": True,
           "ignore_index": -100, "position_mode": "preserve", "flatten": True}


@pytest.fixture
def batches(tmp_path, tokenizer_dir):
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": t} for t in make_documents(40, seed=5)])
    source = StaticMixtureWorkSource([Dataset.from_path("d", str(tmp_path / "d"))])
    pipeline = (Pipeline(source).options(lanes=1, prefetch=0)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(33, algorithm="best_fit").batch(4))
    return [b.to_training(**OPTIONS) for b in pipeline]


def test_real_batches_pass(batches):
    assert batches and any(int(b["padding_mask"].sum()) for b in batches)  # padding checked
    for out in batches:
        check_training_batch(out, 4, 32)


@pytest.mark.parametrize("damage, named", [
    (lambda o: o["labels"].view(-1).__setitem__(int(o["padding_mask"].view(-1).nonzero()[0]), 5),
     "a padding position has a label that counts"),
    (lambda o: o["num_valid_tokens"].add_(1), "labels count"),
    (lambda o: o["positions"].view(4, 32)[1].__setitem__(0, 3), "does not start at position 0"),
    (lambda o: o["positions"].view(4, 32)[2].__setitem__(5, 9), "neither grow by one"),
])
def test_each_damage_is_named(batches, damage, named):
    out = next(b for b in batches if int(b["padding_mask"].sum()))
    out = {k: v.clone() for k, v in out.items()}
    damage(out)
    problems = training_batch_problems(out, 4, 32)
    assert any(named in p for p in problems), problems
    with pytest.raises(RuntimeError, match="malformed training batch"):
        check_training_batch(out, 4, 32)
