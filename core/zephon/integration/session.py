"""One rank's pipeline as a training loop consumes it: :class:`LoaderSession`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from zephon.errors import ConfigError
from zephon.meter import LoaderMeter
from zephon.pipeline import Pipeline
from zephon.sample_batch import SampleBatch


class LoaderSession:
    """One rank's pipeline as the training loop consumes it.

    Iterating yields one microbatch at a time as ``batch.to_training(**training)``, and
    records what was handed out (tokens, padding, labels that count, the seconds the loop
    waited) for :meth:`metrics`. :meth:`state_dict` describes the microbatches handed out so
    far, never those the prefetch thread prepared, so a resume from it continues with the next
    one, token for token. Iterating again after the end of the data starts the data over
    (:meth:`Pipeline.reset`)."""

    def __init__(self, pipeline: Pipeline, training: Mapping[str, Any] | None = None, *,
                 metrics_group: Any = None, replicas: int = 1) -> None:
        """``replicas``: ranks that read each data-parallel rank's lanes within
        ``metrics_group`` (tensor-parallel peers reading alike), whose figures count once."""
        self.pipeline = pipeline
        self.training = dict(training or {})
        """``SampleBatch.to_training`` options."""
        self.meter = LoaderMeter(metrics_group, replicas)
        """Totals of this rank; :meth:`metrics` sums them over ``metrics_group``."""
        self._ended = [False]
        """Whether the last iterator reached the end of the data (a list its generator sets:
        see :meth:`batches`)."""
        self._active: Iterator[tuple[SampleBatch, dict[str, Any]]] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (out for _, out in self.batches())

    def batches(self, *, cycle: bool = False, said: Callable[[str], None] | None = None
                ) -> Iterator[tuple[SampleBatch, dict[str, Any]]]:
        """Each microbatch and its training tensors, for adapters that also need the
        records (traces); iterating the session gives the tensors alone. A new call closes
        the previous iterator (one consumer at a time). ``cycle``: at the end of the data,
        start it over (:meth:`Pipeline.reset`, the same order again) and go on, telling
        ``said`` so; data that ends before its first microbatch is an error then, not a
        loop that never yields."""
        self.close()
        if self._ended[0]:
            self.pipeline.reset()
        self._ended[0] = False
        # The generator holds what it uses, not the session: a session the caller drops
        # then drops its iterator at once (no reference cycle to wait for the collector),
        # and the iterator stops its prefetch thread.
        parts = (self.pipeline, self.training, self.meter, self._ended)
        self._active = _cycled(*parts, said) if cycle else _hand_out(*parts)
        return self._active

    def close(self) -> None:
        """Stop the prefetch of the current iterator; the consumed state stays as it is."""
        active, self._active = self._active, None
        if active is not None:
            active.close()

    def restart(self) -> None:
        """Start over from the beginning of the data at the next :meth:`batches`."""
        self.close()
        self._ended[0] = True

    def metrics(self) -> dict[str, float]:
        """``zephon/...`` figures of the window since the last call; a collective over
        ``metrics_group`` when one was given (call it on every rank at the same step)."""
        return self.meter.window(self.pipeline.report())

    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": entry}`` for this rank's lanes: plain data (JSON-safe)."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state holding (at least) this rank's lanes, written at any
        data-parallel size dividing the lanes (see :func:`merge_states`)."""
        self.close()
        self.pipeline.load_state_dict(dict(state))
        self._ended[0] = False


def _hand_out(pipeline: Pipeline, training: Mapping[str, Any], meter: LoaderMeter,
              ended: list[bool]) -> Iterator[tuple[SampleBatch, dict[str, Any]]]:
    """The session's microbatches with their training tensors, each counted in ``meter``;
    ``ended[0]`` is set at the end of the data."""
    start = time.perf_counter()
    for batch in pipeline:
        out = batch.to_training(**training)
        _record(meter, training, batch, out, time.perf_counter() - start)
        yield batch, out
        start = time.perf_counter()
    ended[0] = True


def _cycled(pipeline: Pipeline, training: Mapping[str, Any], meter: LoaderMeter,
            ended: list[bool], said: Callable[[str], None] | None
            ) -> Iterator[tuple[SampleBatch, dict[str, Any]]]:
    """:func:`_hand_out` over and over: the data started over at each end. The first pass
    may hand out nothing (a state saved on the last microbatch of a pass); a pass from the
    start that hands out nothing is an error."""
    from_start = False
    while True:
        handed = 0
        for item in _hand_out(pipeline, training, meter, ended):
            handed += 1
            yield item
        if not handed and from_start:
            raise ConfigError("the data ends before its first microbatch: there is nothing "
                              "to start over with")
        from_start = True
        if said is not None:
            said(f"zephon: end of data after {handed} microbatches on this rank; starting "
                 "over")
        pipeline.reset()
        ended[0] = False


def _record(meter: LoaderMeter, training: Mapping[str, Any], batch: SampleBatch,
            out: Mapping[str, Any], wait_s: float) -> None:
    """Count a microbatch handed out, finding each tensor under the name the training
    options give it (``rename_fields``), or from the records where it was left out."""
    renamed = training.get("rename_fields") or {}

    def tensor(name: str) -> Any:
        return out.get(renamed.get(name, name))

    ids = tensor("input_ids")
    if ids is not None:
        tokens = int(ids.numel())
    else:  # excluded: the rows' tokens, less the last of each where labels shift them
        shift = 1 if training.get("return_labels") else 0
        tokens = sum(len(r.payload["input_ids"]) - shift for r in batch.records)
    padding_mask, valid_count, loss_mask = (tensor(n) for n in (
        "padding_mask", "num_valid_tokens", "loss_mask"))
    if padding_mask is not None:
        padding = int(padding_mask.sum())
    else:
        padding = sum(int(r.meta.get("padding", 0)) for r in batch.records)
    if valid_count is not None:
        valid = int(valid_count.sum())
    elif loss_mask is not None:
        valid = int(loss_mask.sum())
    else:
        valid = tokens - padding
    meter.record(tokens, padding, valid, wait_s)
