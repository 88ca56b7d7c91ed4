"""pack_flat / pack_sequences: every token of every document comes out exactly once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.errors import ConfigError
from zephon.ops.pack import Doc, Packer, PackSpec


def run_packer(lengths, max_length, algorithm, bins=4, flat=True, seed=0):
    rng = np.random.default_rng(seed)
    docs = [Doc(rng.integers(1, 1000, size=n).astype(np.int32), f"d{i}", "ds")
            for i, n in enumerate(lengths)]
    packer = Packer(PackSpec(max_length, algorithm, max_open_bins=bins, flat=flat), 0, lane=3)
    rows = []
    for doc in docs:
        rows += packer.add(doc)
    rows += packer.flush()
    return docs, rows, packer


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 80), min_size=1, max_size=30), st.integers(2, 50),
       st.sampled_from(["wrap", "first_fit", "best_fit"]), st.integers(1, 5))
def test_every_token_exactly_once(lengths, max_length, algorithm, bins):
    docs, rows, packer = run_packer(lengths, max_length, algorithm, bins)
    covered = {d.doc_id: np.zeros(len(d.tokens), dtype=int) for d in docs}
    by_id = {d.doc_id: d for d in docs}
    for row in rows:
        tokens, positions = row.payload["input_ids"], row.payload["positions"]
        assert len(tokens) == max_length and tokens.dtype == np.int32
        used = 0
        for span in row.meta["documents"]:
            assert span.row_start == used
            piece = tokens[span.row_start:span.row_start + span.length]
            doc = by_id[span.doc_id]
            assert (piece == doc.tokens[span.doc_start:span.doc_start + span.length]).all()
            assert (positions[span.row_start:span.row_start + span.length]
                    == np.arange(span.length)).all()
            covered[span.doc_id][span.doc_start:span.doc_start + span.length] += 1
            used += span.length
        assert row.meta["padding"] == max_length - used
        assert (positions[used:] == np.arange(max_length - used)).all()
    for doc_id, counts in covered.items():
        assert (counts == 1).all(), doc_id
    if algorithm == "wrap":
        assert all(r.meta["padding"] == 0 for r in rows[:-1])
    else:
        # Bin packing never splits a document that fits in one row.
        for doc in docs:
            if len(doc.tokens) <= max_length:
                pieces = [s for r in rows for s in r.meta["documents"] if s.doc_id == doc.doc_id]
                assert len(pieces) == 1
    assert packer.padding_tokens == sum(r.meta["padding"] for r in rows)


def test_wrap_tail_restarts_positions():
    _, rows, _ = run_packer([6, 6], 4, "wrap")
    assert [r.payload["positions"].tolist() for r in rows] == [
        [0, 1, 2, 3], [0, 1, 0, 1], [0, 1, 2, 3]]
    assert [(s.doc_id, s.doc_start) for s in rows[2].meta["documents"]] == [("d1", 2)]


def test_best_fit_chooses_tightest_bin():
    _, rows, _ = run_packer([6, 3, 3, 1], 8, "best_fit")
    # 6 opens bin A (2 left); 3 opens B (5 left); 3 fits B (2 left); 1 goes to the first of
    # the tightest bins (A).
    contents = [[s.doc_id for s in r.meta["documents"]] for r in rows]
    assert ["d0", "d3"] in contents


def test_first_fit_chooses_first_bin():
    _, rows, _ = run_packer([5, 6, 2], 8, "first_fit")
    contents = [[s.doc_id for s in r.meta["documents"]] for r in rows]
    assert ["d0", "d2"] in contents


def test_pack_sequences_keeps_documents():
    docs, rows, _ = run_packer([3, 4, 2], 8, "first_fit", flat=False)
    assert all(r.meta["packed_sequences"] for r in rows)
    first = rows[0].payload["documents"]
    assert [len(d) for d in first] == [3, 4]
    assert (first[0] == docs[0].tokens).all()


def test_snapshot_restore_continues_identically():
    rng = np.random.default_rng(1)
    docs = [Doc(rng.integers(1, 100, size=int(n)).astype(np.int32), f"d{i}", "x")
            for i, n in enumerate(rng.integers(1, 30, size=40))]
    full = Packer(PackSpec(16, "best_fit", max_open_bins=3), 0, 0)
    reference = [r for d in docs for r in full.add(d)] + full.flush()
    first = Packer(PackSpec(16, "best_fit", max_open_bins=3), 0, 0)
    out = [r for d in docs[:17] for r in first.add(d)]
    resumed = Packer(PackSpec(16, "best_fit", max_open_bins=3), 0, 0)
    resumed.restore(first.snapshot())
    out += [r for d in docs[17:] for r in resumed.add(d)] + resumed.flush()
    assert [r.payload["input_ids"].tolist() for r in out] == \
        [r.payload["input_ids"].tolist() for r in reference]
    assert [r.meta["id"] for r in out] == [r.meta["id"] for r in reference]


@pytest.mark.parametrize("kwargs, option", [
    ({"max_length": 1}, "max_length"),
    ({"max_length": 8, "algorithm": "greedy"}, "algorithm"),
    ({"max_length": 8, "max_open_bins": 0}, "max_open_bins"),
])
def test_bad_options(kwargs, option):
    with pytest.raises(ConfigError, match=option):
        PackSpec(**kwargs)


def test_snapshot_holds_only_open_pieces():
    import pickle

    packer = Packer(PackSpec(64, "wrap"), 0, 0)
    rows = packer.add(Doc(np.arange(100_000, dtype=np.int32), "long", "x"))
    assert len(rows) == 100_000 // 64
    state = pickle.dumps(packer.snapshot())
    assert len(state) < 4 * 64 + 1000
    resumed = Packer(PackSpec(64, "wrap"), 0, 0)
    resumed.restore(pickle.loads(state))
    [last] = resumed.flush()
    assert last.payload["input_ids"][:100_000 % 64].tolist() == \
        list(range(100_000 - 100_000 % 64, 100_000))
    assert last.meta["documents"][0].doc_start == 100_000 - 100_000 % 64
