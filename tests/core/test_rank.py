"""The rank stream: read-ahead bounded by the token budget, and the end-of-data protocol
(early and on-demand agreements) against simulated peers, in one process."""

from __future__ import annotations

import random
import time

import pytest

from zephon import Pipeline
from zephon.engine import rank as rank_module
from zephon.engine.agreement import SPAN, UNKNOWN, Pending, check_agreement_group
from zephon.engine.lane import Lane
from zephon.engine.rank import WINDOW_ROUNDS, WINDOWS_HELD, window_rounds
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

LANES, MICROBATCH, LENGTH = 4, 2, 33
ROUND_TOKENS = LANES * MICROBATCH * LENGTH


def pipeline(paths: dict, tokenizer_dir: str, **options) -> Pipeline:
    datasets = [Dataset.from_path(n, p) for n, p in paths.items()]
    source = StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(paths, 1.0)), seed=3,
                                     unit_bytes=2048, on_exhausted="drain")
    return (Pipeline(source).options(lanes=LANES, **options)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(LENGTH).batch(MICROBATCH))


def tokens(batches) -> list[list[list[int]]]:
    return [[r.payload["input_ids"].tolist() for r in b.records] for b in batches]


def window_start(index: int, largest: int) -> int:
    """The first round of window ``index`` in the schedule 1, 2, 4, ... largest."""
    return sum(rank_module._window_size(i, largest) for i in range(index))


class SimulatedPeers:
    """An agreement with one more rank, whose entries ``peer(first, entries, early)`` gives
    (``early``: issued ahead of need, when a real peer may not have the window yet)."""

    def __init__(self, run: Pipeline, peer):
        self.stream = run.loader().stream
        self.stream.agree = self
        self.peer = peer
        self.calls: list[tuple[int, list[int]]] = []

    def start(self, first: int, entries: list[int]) -> Pending:
        early = sum(self.stream.agreements.values()) == len(self.calls) + 1 and \
            self.stream.agreements["ahead"] > sum(1 for c in self.calls if c[2])
        theirs = self.peer(first, list(entries), early)
        self.calls.append((first, list(entries), early))
        return Pending([min(a, b) for a, b in zip(entries, theirs, strict=True)])


def test_window_rounds_fit_the_budget() -> None:
    assert window_rounds(1 << 24, None) == WINDOW_ROUNDS  # unpacked rows: no fixed size
    assert window_rounds(1 << 24, 8 * 8 * 4097) == WINDOW_ROUNDS
    assert window_rounds(WINDOWS_HELD * 5 * 1000, 1000) == 5
    assert window_rounds(10, 1000) == 1  # never below one round


def test_read_ahead_stays_within_the_token_budget(two_datasets, tokenizer_dir,
                                                  monkeypatch) -> None:
    made = [0]
    real = Lane.next_microbatch

    def counted(self):
        batch = real(self)
        made[0] += batch is not None
        return batch

    monkeypatch.setattr(Lane, "next_microbatch", counted)
    budget = WINDOWS_HELD * 2 * ROUND_TOKENS  # windows of two rounds
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=budget)
    assert run.loader().stream.largest_window == 2
    history, out = [], []
    for batch in run:
        time.sleep(0.003)  # a trainer slower than the loader: the producer fills its budget
        out.append(batch)
        history.append(made[0] - len(out))
    assert len(out) > 30
    # Near the end the producer runs the lanes out to count what is left over (never held).
    ahead = max(history[:len(out) - WINDOWS_HELD * 2 * LANES])
    assert ahead <= WINDOWS_HELD * 2 * LANES, "read ahead beyond the token budget"
    assert ahead >= 2 * LANES, "the producer never got a window ahead"
    assert tokens(out) == tokens(pipeline(two_datasets, tokenizer_dir, prefetch=0))


def test_a_slow_consumer_agrees_ahead_of_need(two_datasets, tokenizer_dir) -> None:
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=WINDOWS_HELD * 2 *
                   ROUND_TOKENS)
    peers = SimulatedPeers(run, lambda first, entries, early: entries)
    out = []
    for batch in run:
        out.append(batch)
        time.sleep(0.003)
    counts = run.loader().stream.agreements
    rounds = len(out) // LANES
    assert counts["ahead"] + counts["on_demand"] == len(peers.calls) <= rounds / 2 + 4
    assert counts["ahead"] > counts["on_demand"], counts


@pytest.mark.parametrize("seed", range(4))
def test_a_peer_that_lags_at_random_changes_no_batch(two_datasets, tokenizer_dir,
                                                     seed) -> None:
    """A peer that has made a random number of windows ahead: early agreements come back
    unknown at random, the consumer agrees again when it needs the window, and the data is
    the same."""
    straight = tokens(pipeline(two_datasets, tokenizer_dir, prefetch=0))
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=WINDOWS_HELD * 2 *
                   ROUND_TOKENS)
    rng = random.Random(seed)

    def peer(first: int, entries: list[int], early: bool) -> list[int]:
        known = rng.randint(0 if early else 1, SPAN)  # on demand, every rank has the window
        return entries[:known] + [UNKNOWN] * (SPAN - known)

    peers = SimulatedPeers(run, peer)
    out = []
    for batch in run:
        out.append(batch)
        time.sleep(0.002)
    assert tokens(out) == straight
    early = [c for c in peers.calls if c[2]]
    assert all(c[1][0] != UNKNOWN for c in peers.calls if not c[2])
    rounds = len(out) // LANES
    assert len(peers.calls) <= 2 * (rounds / 2 + 2)  # at most two per window
    assert len(early) == run.loader().stream.agreements["ahead"]


def test_a_peer_that_never_gets_ahead_means_one_agreement_per_window(
        two_datasets, tokenizer_dir) -> None:
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=WINDOWS_HELD * 2 *
                   ROUND_TOKENS)
    SimulatedPeers(run, lambda first, entries, early: entries[:1] + [UNKNOWN] * (SPAN - 1))
    out = list(run)
    counts = run.loader().stream.agreements
    assert counts["ahead"] == 0  # never a window known ahead: no early agreement
    assert counts["on_demand"] <= len(out) // LANES / 2 + 2


@pytest.mark.parametrize("end_round", [0, 1, 5, 9])
def test_a_peer_whose_data_ends_first_ends_this_rank_at_the_same_round(
        two_datasets, tokenizer_dir, end_round) -> None:
    largest = 4
    budget = WINDOWS_HELD * largest * ROUND_TOKENS
    reference = pipeline(two_datasets, tokenizer_dir, prefetch=0)
    straight = tokens(reference)
    assert len(straight) > 12 * LANES
    made = sum(len(b) for b in straight) + reference.report().leftover["rows"]

    def peer(first: int, entries: list[int], early: bool) -> list[int]:
        out = []
        for index in range(first, first + SPAN):
            begin = window_start(index, largest)
            size = rank_module._window_size(index, largest)
            out.append(max(0, min(size, end_round - begin)))
        return out

    for consumer_sleep in (0.0, 0.002):
        run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=budget)
        SimulatedPeers(run, peer)
        out = []
        for batch in run:
            out.append(batch)
            time.sleep(consumer_sleep)
        assert tokens(out) == straight[:end_round * LANES]
        # every row no rank handed out is left over
        assert run.report().leftover["rows"] + sum(len(b) for b in out) == made


def test_gpu_backends_are_refused_for_the_agreement(monkeypatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ConfigError, match=r"process_group uses the nccl backend.*gloo"):
        check_agreement_group(object())
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    check_agreement_group(object())  # CPU tensors go to gloo there
