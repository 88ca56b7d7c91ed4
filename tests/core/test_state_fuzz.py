"""Seeded random changes to a valid mid-run loader state.

300 changes are made to the state as written: each is refused by an error naming the entry
and the field (its checksum, for most), or, when the change left the state as it was, the
resumed run reads exactly the batches of the untouched state. 200 more are made and the
entries sealed again, as someone editing a state on purpose would, so that the loader's
field checks meet them. Each change is one of: delete a key or item, truncate a list, set
None, give a field another type, set a number to a negative, huge or other value, flip a
flag, change a string, add a junk key, swap the entries of two lanes, or swap one part
between them. A resealed state is loaded into one pipeline, one change after another. Either
the load (or, for a JSON Lines row that only reading can count, the first read) raises a
StateMismatchError naming the entry, or the loader accepts the state and the resumed run
delivers at least one batch, whose tokens convert to training tensors, and a report. Any
other exception, or an accepted state that delivers no batch, fails with the change that
caused it.
"""

from __future__ import annotations

import copy
import random
import traceback
from collections.abc import Iterator
from itertools import islice
from typing import Any

import pytest

from tests.kit.batches import batch_ids
from tests.kit.state import resealed
from tests.kit.state_corpus import build, mid_run, write_corpus
from zephon import StateMismatchError
from zephon.text.tokenizer import load_tokenizer

CHANGES = 200
SEED = 43
Path = tuple[Any, ...]


def locations(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every place in ``value`` (containers and leaves) with what it holds."""
    yield path, value
    if isinstance(value, dict):
        for key, part in value.items():
            yield from locations(part, (*path, key))
    elif isinstance(value, list):
        for index, part in enumerate(value):
            yield from locations(part, (*path, index))


def parent(state: dict[str, Any], path: Path) -> Any:
    for key in path[:-1]:
        state = state[key]
    return state


def other_type(value: Any, rng: random.Random) -> Any:
    choices = [str(value), [value], {"value": value}, 1.5, True, "x"]
    if isinstance(value, int) and not isinstance(value, bool):
        choices.append(float(value))
    return rng.choice([c for c in choices if type(c) is not type(value)])


def other_number(value: int, rng: random.Random) -> int:
    return rng.choice([-1, -rng.randint(2, 10**6), 2**63, 2**64 + 5, 10**30, value + 1,
                       max(0, value - 1), rng.randint(0, 1000), 0])


def change(state: dict[str, Any], rng: random.Random) -> str:
    """Change ``state`` in place in one random way; what was done, for messages."""
    places = list(locations(state))
    kind = rng.choice(["delete", "truncate", "none", "type", "number", "flag", "string",
                       "junk", "swap_entries", "swap_part"])
    inner = [(p, v) for p, v in places if p]

    def pick(test) -> tuple[Path, Any] | None:
        found = [(p, v) for p, v in inner if test(v)]
        return rng.choice(found) if found else None

    if kind == "swap_entries":
        state["lane_0"], state["lane_1"] = state["lane_1"], state["lane_0"]
        return "swapped the entries of lanes 0 and 1"
    if kind == "swap_part":
        shared = [p for p, _ in inner if p[0] == "lane_0" and len(p) > 1
                  and _holds(state, ("lane_1", *p[1:]))]
        path = rng.choice(shared)
        other = ("lane_1", *path[1:])
        a, b = parent(state, path), parent(state, other)
        a[path[-1]], b[other[-1]] = b[other[-1]], a[path[-1]]
        return f"swapped {path[1:]} between lanes 0 and 1"
    if kind == "junk":
        path, target = rng.choice([(p, v) for p, v in places if isinstance(v, dict)])
        target[f"junk{rng.randint(0, 99)}"] = rng.choice([0, "x", None, [1], {"a": 1}])
        return f"added a junk key to {path}"
    tests = {
        "delete": lambda v: True,
        "truncate": lambda v: isinstance(v, list) and v,
        "none": lambda v: v is not None,
        "type": lambda v: True,
        "number": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "flag": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
    }
    path, value = pick(tests[kind]) or pick(tests["delete"])
    holder, key = parent(state, path), path[-1]
    if kind == "delete":
        del holder[key]
    elif kind == "truncate":
        del value[rng.randrange(len(value)):]
    elif kind == "none":
        holder[key] = None
    elif kind == "type":
        holder[key] = other_type(value, rng)
    elif kind == "number":
        holder[key] = other_number(value, rng)
    elif kind == "flag":
        holder[key] = not value
    else:
        holder[key] = rng.choice([value + "x", "", value[::-1]])
    return f"{kind} at {path} (was {str(value)[:60]!r}, now {str(_get(state, path))[:60]!r})"


def _holds(state: Any, path: Path) -> bool:
    for key in path:
        if not ((isinstance(state, dict) and key in state) or (
                isinstance(state, list) and isinstance(key, int) and key < len(state))):
            return False
        state = state[key]
    return True


def _get(state: Any, path: Path) -> Any:
    return parent(state, path)[path[-1]] if _holds(state, path) else "<deleted>"


def test_random_changes_to_a_state_as_written_are_refused_naming_the_field(tmp_path,
                                                                           tokenizer_dir):
    corpus, tokenizer = write_corpus(tmp_path), load_tokenizer(tokenizer_dir)
    valid = mid_run(build(corpus, tokenizer))
    pipeline = build(corpus, tokenizer)
    pipeline.load_state_dict(copy.deepcopy(valid))
    expected = batch_ids(islice(pipeline, 3))
    rng = random.Random(SEED + 1)
    refused = 0
    for _ in range(300):
        state = copy.deepcopy(valid)
        what = change(state, rng)
        try:
            pipeline.load_state_dict(state)
        except StateMismatchError as exc:
            assert str(exc).startswith("loader state"), f"{what}: {exc}"
            refused += 1
            continue
        assert state == valid, f"{what}: a changed state was accepted"
        assert batch_ids(islice(pipeline, 3)) == expected, what
    assert refused >= 250, refused  # the rest changed nothing (a value set to itself)


def test_random_changes_are_refused_or_resume(tmp_path, tokenizer_dir):
    corpus, tokenizer = write_corpus(tmp_path), load_tokenizer(tokenizer_dir)
    valid = mid_run(build(corpus, tokenizer))
    pipeline = build(corpus, tokenizer)
    rng = random.Random(SEED)
    refused = resumed = 0
    for _ in range(CHANGES):
        state = copy.deepcopy(valid)
        what = change(state, rng)
        try:
            pipeline.load_state_dict(resealed(state))
            batches = list(islice(pipeline, 3))
        except StateMismatchError as exc:
            assert str(exc).startswith("loader state"), f"{what}: {exc}"
            refused += 1
            continue
        except Exception:
            pytest.fail(f"{what}: raised\n{traceback.format_exc()}")
        assert batches, f"{what}: the state was accepted, but the run delivered no batch"
        for batch in batches:
            tensors = batch.to_training(return_labels=True, return_cu_seqlens=True,
                                        return_padding_mask=True)
            assert tensors["input_ids"].shape == (2, 15), what
        pipeline.report()
        resumed += 1
    assert refused + resumed == CHANGES
    assert refused >= CHANGES // 2 and resumed >= 10, (refused, resumed)
