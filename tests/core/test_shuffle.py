"""``shuffle``: a seeded buffer shuffle whose node resumes exactly and loses nothing."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.kit.rows import Rows
from zephon.errors import ConfigError
from zephon.ops.base import BuildContext
from zephon.ops.shuffle import ShuffleSpec


def ids(node, limit=None):
    out = []
    while (limit is None or len(out) < limit) and (record := node.next()) is not None:
        out.append(record.id)
    return out


def make(buffer_size=5, seed=0, lane=0, base_seed=9, n=40):
    op = ShuffleSpec(buffer_size, seed=seed).build(BuildContext(seed=base_seed, lanes=2))
    upstream = Rows(n)
    return op.node(upstream, lane), upstream


def test_a_permutation_that_depends_on_seed_and_lane():
    order = ids(make()[0])
    assert sorted(order, key=lambda s: int(s[1:])) == [f"r{i}" for i in range(1, 41)]
    assert order != [f"r{i}" for i in range(1, 41)]
    assert ids(make()[0]) == order
    assert ids(make(seed=1)[0]) != order
    assert ids(make(lane=1)[0]) != order
    assert ids(make(base_seed=10)[0]) != order


@pytest.mark.parametrize("cut", [0, 3, 5, 17, 39, 40])
def test_restore_from_plain_snapshots_continues_exactly(cut):
    node, upstream = make()
    head = ids(node, cut)
    saved = pickle.loads(pickle.dumps((node.snapshot(), upstream.snapshot())))
    rest = ids(node)
    again, again_upstream = make()
    again.restore(saved[0])
    again_upstream.restore(saved[1])
    assert head + ids(again) == head + rest
    assert all(isinstance(r["payload"]["input_ids"], np.ndarray)
               for r in saved[0]["shuffler"]["buffer"])


def test_bad_options():
    with pytest.raises(ConfigError, match="buffer_size"):
        ShuffleSpec(0)
    with pytest.raises(ConfigError, match="seed"):
        ShuffleSpec(4, seed="x")
