"""``batch``: microbatches from rows, short batches at a flush dropped and counted, or kept."""

from __future__ import annotations

import logging

import pytest

from tests.kit.rows import Rows
from zephon.ops.batch import BatchNode, BatchSpec


def drain(node):
    out = []
    while (batch := node.next()) is not None:
        out.append(batch)
    return out


def test_full_batches_then_the_short_one_is_dropped_and_counted(caplog):
    node = BatchNode(BatchSpec(3), Rows(7), lane=5)
    with caplog.at_level(logging.WARNING, logger="zephon.ops.batch"):
        batches = drain(node)
    assert [b.ids for b in batches] == [["r1", "r2", "r3"], ["r4", "r5", "r6"]]
    assert [(b.lane, b.index) for b in batches] == [(5, 0), (5, 1)]
    assert node.snapshot()["stats"]["dropped"] == {"rows": 1, "documents": 1, "tokens": 4}
    assert "dropped a short batch of 1 row(s)" in caplog.text
    assert node.next() is None  # stays ended


def test_drop_last_false_keeps_the_short_batch():
    node = BatchNode(BatchSpec(3, drop_last=False), Rows(7), lane=0)
    assert [len(b) for b in drain(node)] == [3, 3, 1]
    assert node.snapshot()["stats"]["dropped"] == {"rows": 0, "documents": 0, "tokens": 0}


def test_snapshot_and_restore_continue_the_numbering():
    upstream = Rows(9)
    node = BatchNode(BatchSpec(2), upstream, lane=1)
    node.next()
    saved, saved_rows = node.snapshot(), upstream.snapshot()
    rest = [b.ids for b in drain(node)]
    again_rows = Rows(9)
    again_rows.restore(saved_rows)
    again = BatchNode(BatchSpec(2), again_rows, lane=1)
    again.restore(saved)
    batches = drain(again)
    assert [b.ids for b in batches] == rest
    assert batches[0].index == 1


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_bad_sizes(size):
    from zephon.errors import ConfigError

    with pytest.raises(ConfigError, match="microbatch_size"):
        BatchSpec(size)
