"""``Pipeline``: the public builder and iterator.

A pipeline is built by chaining operators on a work source, in this order: ``tokenize`` (or
``tokenize_chat``),
``pack_flat`` or ``pack_sequences``, ``shuffle``, ``batch`` (required, last). Each call returns a
new pipeline; nothing is read until iteration. Iterating hands out SampleBatch objects for this
rank (see :mod:`zephon.engine.rank`); a new ``iter()`` continues from the consumed state, and
``reset()`` starts over.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from zephon.batch import SampleBatch
from zephon.engine.agreement import RoundAgreement
from zephon.engine.lane import LanePlan
from zephon.engine.rank import RankStream
from zephon.engine.state import (
    STATE_VERSION,
    check_fingerprint,
    lane_key,
    lane_state_from_plain,
    lane_state_to_plain,
)
from zephon.errors import ConfigError, StateMismatchError
from zephon.io.options import StoreOptions
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackSpec
from zephon.ops.shuffle import ShuffleSpec
from zephon.ops.tokenize import DocumentTokenizer, RowEncoder, TokenizeSpec
from zephon.ops.tokenize_chat import ChatTokenizer, TokenizeChatSpec
from zephon.report import DatasetReport, PipelineReport
from zephon.work.estimation import DatasetEstimate, TokenEstimation, estimate_dataset
from zephon.work.source import StaticMixtureWorkSource

log = logging.getLogger(__name__)

_ORDER = ("tokenize", "pack", "shuffle", "batch")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class Pipeline:
    """A loader pipeline over a work source; see the module docstring."""

    def __init__(self, work_source: StaticMixtureWorkSource):
        if not isinstance(work_source, StaticMixtureWorkSource):
            raise ConfigError("Pipeline needs a work source such as StaticMixtureWorkSource, "
                              f"got {type(work_source).__name__}")
        self.work_source = work_source
        self._ops: dict[str, Any] = {}
        self._io = StoreOptions()
        self._lanes: int | None = None
        self._rank = 0
        self._world = 1
        self._prefetch = 4
        self._process_group: Any = None
        self._stream: RankStream | None = None
        self._pending_state: dict[str, Any] | None = None
        self._fingerprint: dict[str, Any] | None = None

    # -- building --------------------------------------------------------------------------
    def _with(self, stage: str, spec: Any) -> Pipeline:
        if stage in self._ops:
            raise ConfigError(f"{stage} is already in this pipeline")
        later = [s for s in _ORDER[_ORDER.index(stage) + 1:] if s in self._ops]
        if later:
            raise ConfigError(f"{stage} must come before {later[0]} (operator order: "
                              f"{' -> '.join(_ORDER)})")
        clone = copy.copy(self)
        clone._ops = {**self._ops, stage: spec}
        clone._stream = None
        return clone

    def options(self, io_options: StoreOptions | None = None, *, lanes: int | None = None,
                dp_rank: int | None = None, dp_world_size: int | None = None,
                prefetch: int | None = None, process_group: Any = None) -> Pipeline:
        """Storage, lanes and this process's place among the data-parallel ranks.

        ``lanes`` fixes the data for a run: it must stay the same across resumes, while the
        data-parallel size may change to any divisor of it. ``prefetch`` is how many
        microbatches a background thread prepares ahead (0: none); it never changes the data.
        ``process_group`` is the data-parallel group used to agree on the end of data.
        """
        clone = copy.copy(self)
        clone._stream = None
        if io_options is not None:
            if not isinstance(io_options, StoreOptions):
                raise ConfigError("options: io_options must be a StoreOptions")
            clone._io = io_options
        for name, value, least in (("lanes", lanes, 1), ("dp_world_size", dp_world_size, 1),
                                   ("prefetch", prefetch, 0), ("dp_rank", dp_rank, 0)):
            if value is not None and (not isinstance(value, int) or value < least):
                raise ConfigError(f"options: {name} must be an integer >= {least}, "
                                  f"got {value!r}")
        if lanes is not None:
            clone._lanes = lanes
        if dp_world_size is not None:
            clone._world = dp_world_size
        if dp_rank is not None:
            clone._rank = dp_rank
        if prefetch is not None:
            clone._prefetch = prefetch
        if process_group is not None:
            clone._process_group = process_group
        if clone._rank >= clone._world:
            raise ConfigError(f"options: dp_rank={clone._rank} must be < dp_world_size="
                              f"{clone._world}")
        return clone

    def tokenize(self, tokenizer_id: str | None = None, field: str = "text", *,
                 tokenizer: Any = None, add_bos: bool | None = None, add_eos: bool | None = None,
                 max_document_tokens: int | None = None, batch_size: int = 256) -> Pipeline:
        """Encode the text column ``field`` into token ids; see :mod:`zephon.ops.tokenize`."""
        return self._with("tokenize", TokenizeSpec(
            field=field, tokenizer_id=tokenizer_id, tokenizer=tokenizer, add_bos=add_bos,
            add_eos=add_eos, max_document_tokens=max_document_tokens, batch_size=batch_size))

    def tokenize_chat(self, tokenizer_id: str | None = None, field: str = "messages", *,
                      tokenizer: Any = None, chat_template: str | None = None,
                      tools_field: str | None = None, train_on: str = "all",
                      on_untrainable: str = "drop", max_document_tokens: int | None = None,
                      batch_size: int = 64) -> Pipeline:
        """Render and encode conversations with assistant-only train masks; see
        :mod:`zephon.ops.tokenize_chat`."""
        return self._with("tokenize", TokenizeChatSpec(
            field=field, tokenizer_id=tokenizer_id, tokenizer=tokenizer,
            chat_template=chat_template, tools_field=tools_field, train_on=train_on,
            on_untrainable=on_untrainable, max_document_tokens=max_document_tokens,
            batch_size=batch_size))

    def pack_flat(self, max_length: int, algorithm: str = "wrap", *,
                  pad_token_id: int | None = None, max_open_bins: int = 8) -> Pipeline:
        """Pack documents into fixed-length rows; see :mod:`zephon.ops.pack`."""
        return self._with("pack", PackSpec(max_length, algorithm, pad_token_id, max_open_bins,
                                           flat=True))

    def pack_sequences(self, max_length: int, algorithm: str = "wrap", *,
                       max_open_bins: int = 8) -> Pipeline:
        """Group documents into rows of at most ``max_length`` tokens, kept as lists."""
        return self._with("pack", PackSpec(max_length, algorithm, None, max_open_bins,
                                           flat=False))

    def shuffle(self, buffer_size: int, *, seed: int = 0) -> Pipeline:
        """Seeded buffer shuffle of rows; see :mod:`zephon.ops.shuffle`."""
        return self._with("shuffle", ShuffleSpec(buffer_size, seed))

    def batch(self, microbatch_size: int, drop_last: bool = True) -> Pipeline:
        """Group records into SampleBatch objects; see :mod:`zephon.ops.batch`."""
        return self._with("batch", BatchSpec(microbatch_size, drop_last))

    # -- runtime ---------------------------------------------------------------------------
    @property
    def lanes(self) -> int:
        return self._lanes if self._lanes is not None else self._world

    def _ensure_stream(self) -> RankStream:
        if self._stream is not None:
            return self._stream
        if "batch" not in self._ops:
            raise ConfigError("the pipeline needs a batch(...) operator to be iterated")
        source = self.work_source
        if self._lanes is None and self._world > 1:
            warnings.warn(
                f"zephon: lanes is not set, so it equals dp_world_size={self._world}; changing "
                "the number of data-parallel ranks will then change the data. Set "
                "options(lanes=...) to a multiple of every size you may use.", stacklevel=3)
        lanes = self.lanes
        if lanes % self._world:
            raise ConfigError(
                f"dp_world_size={self._world} does not divide lanes={lanes}; valid data-parallel "
                f"sizes for {lanes} lanes are {_divisors(lanes)}")
        tokenize = self._ops.get("tokenize")
        pack = self._ops.get("pack")
        if pack is not None and tokenize is None:
            raise ConfigError("pack_flat/pack_sequences need tokenize(...) before them")
        if source.by_tokens and tokenize is None:
            raise ConfigError("token_estimation (mixing by tokens) needs tokenize(...)")
        for dataset in source.datasets:
            dataset.bind(self._io)
        tokenizer: RowEncoder | None = None
        if isinstance(tokenize, TokenizeChatSpec):
            tokenizer = ChatTokenizer(tokenize)
        elif tokenize is not None:
            tokenizer = DocumentTokenizer(tokenize)
        pad = 0
        if pack is not None:
            special = tokenizer.encoder.special
            pad = next((p for p in (pack.pad_token_id, special.pad, special.eos) if p is not None),
                       0)
        plan = LanePlan(source, tokenizer, pack, pad, self._ops.get("shuffle"),
                        self._ops["batch"], lanes)
        source.plan(lanes)
        self._fingerprint = {
            "version": STATE_VERSION,
            "lanes": lanes,
            "work_source": source.fingerprint(),
            "tokenize": tokenizer.fingerprint() if tokenizer else None,
            "pack": {**_spec_dict(pack), "pad_token_id": pad} if pack else None,
            "shuffle": _spec_dict(self._ops.get("shuffle")),
            "batch": _spec_dict(self._ops["batch"]),
        }
        self._stream = RankStream(plan, self._rank, self._world, self._prefetch,
                                  RoundAgreement(self._world, self._process_group))
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._apply_state(state)
        return self._stream

    def __iter__(self) -> Iterator[SampleBatch]:
        return iter(self._ensure_stream())

    def reset(self) -> None:
        """Start over from the beginning of the data at the next ``iter()``."""
        stream = self._ensure_stream()
        stream.reset_to(dict.fromkeys(stream.owned), 0, False, dict.fromkeys(stream.leftover, 0))

    def fingerprint(self) -> dict[str, Any]:
        self._ensure_stream()
        return copy.deepcopy(self._fingerprint)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": entry}`` for the lanes this rank owns; see :mod:`zephon.engine.state`.

        Describes what the caller has consumed; prefetched microbatches are not in it.
        """
        stream = self._ensure_stream()
        out = {}
        for lane in stream.owned:
            out[lane_key(lane)] = {
                "version": STATE_VERSION,
                "lane": lane,
                "fingerprint": self._fingerprint,
                "consumed_global": stream.consumed_global,
                "finished": stream.finished,
                "leftover": dict(stream.leftover) if lane == stream.owned[0] else None,
                "lane_state": lane_state_to_plain(stream.consumed[lane]),
            }
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``: entries for (at least) this rank's lanes, written at any
        data-parallel size that divides the lane count. Extra lanes' entries are ignored."""
        if not isinstance(state, dict):
            raise StateMismatchError(f"load_state_dict expects a dict, got {type(state).__name__}")
        if self._stream is None:
            self._pending_state = state
            self._ensure_stream()
            return
        self._apply_state(state)

    def _apply_state(self, state: dict[str, Any]) -> None:
        stream = self._stream
        assert stream is not None
        lane_entries = {k: v for k, v in state.items() if k.startswith("lane_")}
        if not lane_entries:
            raise StateMismatchError("loader state has no lane entries (keys lane_<n>); was it "
                                     "written by a zephon Pipeline?")
        for key, entry in lane_entries.items():
            if entry.get("version") != STATE_VERSION:
                raise StateMismatchError(f"loader state {key!r} has version "
                                         f"{entry.get('version')}, expected {STATE_VERSION}")
            check_fingerprint(entry["fingerprint"], self._fingerprint, key)
        missing = [lane_key(lane) for lane in stream.owned if lane_key(lane) not in lane_entries]
        if missing:
            raise StateMismatchError(
                f"loader state lacks {missing} needed by rank {self._rank} of {self._world}; "
                f"it holds {sorted(lane_entries)}. Merge the states of all ranks before loading "
                "at another data-parallel size.")
        consumed = {lane_entries[lane_key(lane)]["consumed_global"] for lane in stream.owned}
        consumed |= {e["consumed_global"] for e in lane_entries.values()}
        if len(consumed) != 1:
            raise StateMismatchError(f"loader state entries disagree on how many microbatches "
                                     f"were consumed ({sorted(consumed)}); they come from "
                                     "different steps")
        total = consumed.pop()
        lanes = stream.lanes
        for lane in stream.owned:
            lane_state = lane_entries[lane_key(lane)]["lane_state"]
            done = lane_state["microbatches"] if lane_state else 0
            expected = max(0, -(-(total - lane) // lanes))
            finished = lane_entries[lane_key(lane)]["finished"]
            if done != expected and not finished:
                raise StateMismatchError(
                    f"loader state {lane_key(lane)!r} has {done} microbatches consumed, but "
                    f"{total} global microbatches imply {expected}")
        if total % self._world and not any(e["finished"] for e in lane_entries.values()):
            raise StateMismatchError(
                f"the checkpoint consumed {total} global microbatches, not a multiple of "
                f"dp_world_size={self._world}; resume at a size that divides it")
        leftover = next((e["leftover"] for e in lane_entries.values() if e["leftover"]),
                        dict.fromkeys(stream.leftover, 0))
        stream.reset_to({lane: lane_state_from_plain(lane_entries[lane_key(lane)]["lane_state"])
                         for lane in stream.owned}, total,
                        any(e["finished"] for e in lane_entries.values()), leftover)

    # -- reporting -------------------------------------------------------------------------
    def estimate(self) -> list[DatasetEstimate]:
        """Estimated documents and tokens per dataset (see :mod:`zephon.work.estimation`).

        Uses the work source's ``token_estimation`` (``measure`` when it has none)."""
        stream = self._ensure_stream()
        spec = self.work_source.token_estimation or TokenEstimation()
        return [estimate_dataset(self.work_source, i, self.lanes, stream.plan.tokenizer, spec)
                for i in range(len(self.work_source.datasets))]

    def report(self) -> PipelineReport:
        """Counts for this rank's lanes, as of the last consumed microbatch.

        Documents and tokens count what the lanes had read by then (including what waits in
        open rows or the shuffle buffer), so realized shares are shares of data read; rows
        dropped at a flush and microbatches left over at the end of data are counted apart."""
        stream = self._ensure_stream()
        source = self.work_source
        names = source.names()
        documents = dict.fromkeys(names, 0)
        tokens = dict.fromkeys(names, 0)
        skipped: dict[str, dict[str, int]] = {name: {} for name in names}
        dropped = {"rows": 0, "documents": 0, "tokens": 0}
        padding = microbatches = 0
        for lane in stream.owned:
            snap = stream.consumed[lane]
            if snap is None:
                continue
            counters = snap["counters"]
            microbatches += snap["microbatches"]
            padding += counters["padding_tokens"]
            for name in names:
                documents[name] += counters["documents"][name]
                tokens[name] += counters["tokens"][name]
            for comp, name in zip(snap["components"], names, strict=True):
                for reason, count in comp["skipped"].items():
                    skipped[name][reason] = skipped[name].get(reason, 0) + count
            for key in dropped:
                dropped[key] += counters["dropped"][key]
        unit = tokens if source.by_tokens else documents
        total = sum(unit.values()) or 1
        datasets = [DatasetReport(name, float(w), documents[name], tokens[name],
                                  skipped[name].get("empty", 0), unit[name] / total,
                                  skipped[name])
                    for name, w in zip(names, source.weights, strict=True)]
        return PipelineReport("tokens" if source.by_tokens else "documents", datasets,
                              microbatches, padding, dropped, dict(stream.leftover),
                              stream.finished)


def _spec_dict(spec: Any) -> dict[str, Any] | None:
    return asdict(spec) if spec is not None else None
