"""The rank stream: read-ahead bounded by the token budget, rounds handed out as soon as they
are made, and the end-of-data protocol (agreements ahead of need and on demand) against
simulated peers, in one process."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.kit.batches import batch_ids
from zephon import Pipeline
from zephon.engine.agreement import OPEN, Pending, check_agreement_group
from zephon.engine.lane import Lane
from zephon.engine.rank import MAX_ROUNDS_AHEAD, rounds_ahead
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


class SimulatedPeers:
    """An agreement with one more rank, whose report ``peer(made, ended, on_demand)`` gives
    from this rank's report (``on_demand``: issued because the consumer needs a round)."""

    local = False

    def __init__(self, run: Pipeline, peer):
        self.stream = run.loader().stream
        self.stream.agree = self
        self.peer = peer
        self.calls: list[tuple[int, bool, bool]] = []
        self.horizon = 0

    def start(self, made: int, ended: bool) -> Pending:
        on_demand = self.stream.agreements["on_demand"] > sum(c[2] for c in self.calls)
        self.calls.append((made, ended, on_demand))
        their_made, their_ended = self.peer(made, ended, on_demand)
        agreed = min(made, their_made)
        final = min(made if ended else OPEN, their_made if their_ended else OPEN)
        self.horizon = agreed
        return Pending((agreed, final))


def test_rounds_ahead_fit_the_budget() -> None:
    assert rounds_ahead(1 << 24, None) == MAX_ROUNDS_AHEAD  # unpacked rows: no fixed size
    assert rounds_ahead(1 << 24, 8 * 4 * 4097) == MAX_ROUNDS_AHEAD  # 8 lanes of 4 x 4097
    assert rounds_ahead(5 * 1000, 1000) == 5
    assert rounds_ahead(10, 1000) == 1  # never below one round


def test_read_ahead_stays_within_the_token_budget(two_datasets, tokenizer_dir,
                                                  monkeypatch) -> None:
    made = [0]
    real = Lane.next_microbatch

    def counted(self):
        batch = real(self)
        made[0] += batch is not None
        return batch

    monkeypatch.setattr(Lane, "next_microbatch", counted)
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=2 * ROUND_TOKENS)
    assert run.loader().stream.rounds_ahead == 2
    history, out = [], []
    for batch in run:
        time.sleep(0.003)  # a trainer slower than the loader: the producer fills its budget
        out.append(batch)
        history.append(made[0] - len(out))
    assert len(out) > 30
    # Near the end the producer runs the lanes out to count what is left over (never held).
    ahead = max(history[:len(out) - 3 * LANES])
    # Two rounds held, plus the rest of the one being handed out.
    assert ahead < 3 * LANES, "read ahead beyond the token budget"
    assert ahead >= 2 * LANES, "the producer never filled its budget"
    assert batch_ids(out) == batch_ids(pipeline(two_datasets, tokenizer_dir, prefetch=0))


@pytest.mark.parametrize("with_peers", [False, True])
def test_a_round_is_handed_out_as_soon_as_it_is_made(two_datasets, tokenizer_dir,
                                                     monkeypatch, with_peers) -> None:
    """The producer stalls after round ``stall`` (a slow unit read, say): every microbatch of
    the rounds before it still reaches the trainer, none is held back for later rounds. With
    peers the producer is slow before the stall too, so the consumer keeps outrunning it and
    would rather agree on several rounds at once: it still takes the ones it needs."""
    stall = 7
    made, resume = [0], threading.Event()
    real = Lane.next_microbatch

    def stalling(self):
        if made[0] == (stall + 1) * LANES:
            resume.wait(30)
        elif with_peers and not resume.is_set():
            time.sleep(0.005)
        made[0] += 1
        return real(self)

    straight = batch_ids(pipeline(two_datasets, tokenizer_dir, prefetch=0))
    monkeypatch.setattr(Lane, "next_microbatch", stalling)
    run = pipeline(two_datasets, tokenizer_dir)
    if with_peers:
        SimulatedPeers(run, lambda made, ended, on_demand: (made, ended))
    iterator = iter(run)
    got, started = [], time.monotonic()
    for _ in range((stall + 1) * LANES):
        got.append(next(iterator))
    assert time.monotonic() - started < 20, "rounds waited for the stalled producer"
    assert not resume.is_set()
    resume.set()
    got += list(iterator)
    assert batch_ids(got) == straight


def test_a_slow_consumer_agrees_ahead_of_need(two_datasets, tokenizer_dir) -> None:
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=8 * ROUND_TOKENS)
    peers = SimulatedPeers(run, lambda made, ended, on_demand: (made, ended))
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
    """A peer whose producer is behind this rank's by a random number of rounds: the
    horizon grows by whatever both have, and the data is the same."""
    straight = batch_ids(pipeline(two_datasets, tokenizer_dir, prefetch=0))
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=4 * ROUND_TOKENS)
    rng = random.Random(seed)
    peers: SimulatedPeers

    def peer(made: int, ended: bool, on_demand: bool) -> tuple[int, bool]:
        # On demand the peer, too, has the round its consumer needs.
        least = min(made, peers.horizon + on_demand)
        theirs = rng.randint(least, made)
        return theirs, ended and theirs == made  # the same data: it ends where this rank does

    peers = SimulatedPeers(run, peer)
    out = []
    for batch in run:
        out.append(batch)
        time.sleep(0.002)
    assert batch_ids(out) == straight
    assert len(peers.calls) <= 2 * (len(out) // LANES) + 4


def test_a_peer_that_never_gets_ahead_is_agreed_with_only_on_demand(
        two_datasets, tokenizer_dir) -> None:
    """A peer with just the round its consumer needs: an agreement ahead of need would find
    nothing more, so none is issued; one agreement per round on demand."""
    run = pipeline(two_datasets, tokenizer_dir)
    peers: SimulatedPeers

    def peer(made: int, ended: bool, on_demand: bool) -> tuple[int, bool]:
        return min(made, peers.horizon + 1), False

    peers = SimulatedPeers(run, peer)
    out = list(run)
    counts = run.loader().stream.agreements
    assert counts["ahead"] == 0
    assert counts["on_demand"] <= len(out) // LANES + 2
    assert batch_ids(out) == batch_ids(pipeline(two_datasets, tokenizer_dir, prefetch=0))


def test_a_consumer_that_outruns_its_producer_agrees_every_few_rounds(
        two_datasets, tokenizer_dir) -> None:
    """A tight loop waits for its producer anyway: it waits for 1, 2, 4, ... 16 rounds
    before agreeing, rather than agreeing once per round."""
    run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=64 * ROUND_TOKENS)
    peers = SimulatedPeers(run, lambda made, ended, on_demand: (made, ended))
    out = list(run)
    rounds = len(out) // LANES
    assert rounds > 20
    assert len(peers.calls) <= rounds / 4 + 8, (len(peers.calls), rounds)


@pytest.mark.parametrize("end_round", [0, 1, 5, 9])
def test_a_peer_whose_data_ends_first_ends_the_rounds_at_the_same_round(
        two_datasets, tokenizer_dir, end_round) -> None:
    """The rounds end where the peer's data does; the last round then hands out the rest,
    which for a rank owning every lane is the rest of the rounds, in their order."""
    reference = pipeline(two_datasets, tokenizer_dir, prefetch=0)
    straight = batch_ids(reference)
    assert len(straight) > 12 * LANES
    made_rows = sum(len(b) for b in straight) + reference.report().leftover["rows"]

    def peer(made: int, ended: bool, on_demand: bool) -> tuple[int, bool]:
        return min(made, end_round), made >= end_round

    for consumer_sleep in (0.0, 0.002):
        run = pipeline(two_datasets, tokenizer_dir, read_ahead_tokens=4 * ROUND_TOKENS)
        SimulatedPeers(run, peer)
        out = []
        for batch in run:
            out.append(batch)
            time.sleep(consumer_sleep)
        assert batch_ids(out) == straight
        # the rounds ended at the peer's end; from there on the last round handed them out
        assert [b.position for b in out[:end_round * LANES]] == [None] * (end_round * LANES)
        assert [b.position for b in out[end_round * LANES:]] == \
            list(range(end_round * LANES, len(out)))
        assert run.report().leftover["rows"] + sum(len(b) for b in out) == made_rows


def test_gpu_backends_are_refused_for_the_agreement(monkeypatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ConfigError, match=r"process_group uses the nccl backend.*gloo"):
        check_agreement_group(object())
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    check_agreement_group(object())  # CPU tensors go to gloo there
