"""Batch calls take turns on the tokenizer's pool, handed straight from one to the next."""

from __future__ import annotations

import os
import threading
import time

import pytest

from zephon.demo.assets import make_documents
from zephon.text.pool_turns import MIN_TEXTS, POOL_TURNS, PoolTurns, takes_turn
from zephon.text.tokenizer import TextEncoder, load_tokenizer


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class Overlapping:
    """Wraps ``call``: records each call's first argument and the most calls inside at once,
    holding each call open ``hold_s`` to widen the window two calls could overlap in."""

    def __init__(self, call, hold_s: float = 0.002):
        self.call, self.hold_s = call, hold_s
        self.firsts: list = []
        self.inside = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, first, *args, **kwargs):
        with self.lock:
            self.firsts.append(first)
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(self.hold_s)
            return self.call(first, *args, **kwargs)
        finally:
            with self.lock:
                self.inside -= 1


def test_one_call_is_inside_at_a_time() -> None:
    turns = PoolTurns()
    call = Overlapping(lambda i: i * 2, hold_s=0.001)

    results: list[int] = []

    def caller(base: int) -> None:
        for i in range(20):
            results.append(turns.run(call, base + i))

    threads = [threading.Thread(target=caller, args=(100 * k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert call.most == 1
    assert sorted(results) == sorted(2 * (100 * k + i) for k in range(3) for i in range(20))
    assert turns.started == 60 and turns.waiting == 0


def test_a_returning_caller_waits_until_the_next_has_started() -> None:
    turns = PoolTurns(handoff_s=30.0)  # the bound never decides here
    go, next_started = threading.Event(), threading.Event()
    seen_when_returned: list[bool] = []

    def first() -> None:
        turns.run(go.wait)
        seen_when_returned.append(next_started.is_set())

    a = threading.Thread(target=first)
    a.start()
    wait_until(lambda: turns.started == 1)
    b = threading.Thread(target=turns.run, args=(next_started.set,))
    b.start()
    wait_until(lambda: turns.waiting == 1)
    go.set()
    a.join(10)
    b.join(10)
    assert seen_when_returned == [True]


def test_with_nobody_waiting_a_caller_returns_at_once() -> None:
    turns = PoolTurns(handoff_s=30.0)
    start = time.monotonic()
    assert turns.run(lambda: 7) == 7
    assert time.monotonic() - start < 5.0


def test_a_failing_call_gives_up_its_turn() -> None:
    turns = PoolTurns()

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        turns.run(fail)
    assert turns.run(lambda: "next") == "next"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_not_held_by_a_call_inside_in_the_parent() -> None:
    go = threading.Event()
    before = POOL_TURNS.started
    holder = threading.Thread(target=POOL_TURNS.run, args=(go.wait,))
    holder.start()
    try:
        wait_until(lambda: POOL_TURNS.started > before)
        pid = os.fork()
        if pid == 0:
            try:
                done = threading.Event()
                threading.Thread(target=lambda: (POOL_TURNS.run(lambda: None), done.set()),
                                 daemon=True).start()
                os._exit(0 if done.wait(10) else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        go.set()
        holder.join(10)


def lengths_of_calls(spy: Overlapping) -> list[list[int]]:
    return [[len(t) for t in texts] for texts in spy.firsts]


def test_encoder_batches_go_longest_first_one_at_a_time_and_come_back_in_order(
        tokenizer_dir) -> None:
    hf = load_tokenizer(tokenizer_dir)
    encoder = TextEncoder(hf)
    spy = Overlapping(encoder._fast_batch)
    encoder._fast_batch = spy
    texts = make_documents(3 * MIN_TEXTS, seed=11, min_words=5, max_words=300)
    expected = [e.ids for e in hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    batches = [texts[i:i + MIN_TEXTS] for i in range(0, len(texts), MIN_TEXTS)]
    got: dict[int, list[list[int]]] = {}

    def encode(k: int) -> None:
        for _ in range(5):
            got[k] = [ids.tolist() for ids in encoder.encode(batches[k])]

    threads = [threading.Thread(target=encode, args=(k,)) for k in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [ids for k in range(len(batches)) for ids in got[k]] == expected
    assert spy.most == 1
    assert all(lengths == sorted(lengths, reverse=True) for lengths in lengths_of_calls(spy))
    assert any([len(t) for t in b] != sorted(map(len, b), reverse=True) for b in batches)


def test_small_batches_do_not_take_turns(tokenizer_dir) -> None:
    assert not takes_turn(MIN_TEXTS - 1) and takes_turn(MIN_TEXTS)
    hf = load_tokenizer(tokenizer_dir)
    encoder = TextEncoder(hf)
    spy = Overlapping(encoder._fast_batch)
    encoder._fast_batch = spy
    texts = make_documents(MIN_TEXTS - 1, seed=12, min_words=5, max_words=300)
    before = POOL_TURNS.started
    got = encoder.encode(texts)
    assert POOL_TURNS.started == before
    assert lengths_of_calls(spy) == [[len(t) for t in texts]]
    expected = [e.ids for e in hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert [ids.tolist() for ids in got] == expected
