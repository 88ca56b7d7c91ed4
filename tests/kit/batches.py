"""Microbatches as plain token lists, a work source over equally weighted datasets, and the
resume check every pipeline must pass (in the manner of torchdata's
``run_test_save_load_state``): stopped after any number of microbatches, its state written
as JSON and loaded into a fresh pipeline, it continues with exactly the microbatches a run
that never stopped gives next."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def batch_ids(batches: Iterable[Any]) -> list[list[list[int]]]:
    """Each microbatch as the token ids of each of its rows."""
    return [[r.payload["input_ids"].tolist() for r in b.records] for b in batches]


def equal_weights_source(paths: dict, seed: int = 3, **options: Any) -> StaticMixtureWorkSource:
    """The datasets ``{name: path}`` mixed with equal weights, in units of about 2 KiB."""
    datasets = [Dataset.from_path(n, p) for n, p in paths.items()]
    return StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(paths, 1.0)), seed=seed,
                                   unit_bytes=2048, **options)


def assert_resumes_exactly(make: Callable[[], Pipeline], stops: Sequence[int],
                           total: int | None = None) -> list[list[list[int]]]:
    """For each count in ``stops``: ``make()`` run for that many microbatches, its state
    through JSON into a fresh ``make()``, must go on with the straight run's next microbatches
    to its end (or to ``total``). Returns the straight run's microbatches."""
    straight = batch_ids(islice(make(), total))
    assert len(straight) > max(stops), "stops past the end of the data"
    for stop in stops:
        first = make()
        iterator = iter(first)
        head = batch_ids(islice(iterator, stop))
        state = json.loads(json.dumps(first.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        rest = batch_ids(islice(resumed, None if total is None else total - stop))
        assert head + rest == straight, f"resumed after {stop} microbatches"
    return straight
