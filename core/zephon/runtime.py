"""``Loader``: the runtime a Pipeline creates to iterate, hold state and report.

A Pipeline (the immutable builder) describes what to read and how; ``Pipeline.loader()``
builds its operators once (loading the tokenizer, resolving Hub revisions, planning units) and
returns this object, which owns the rank's stream, its consumed state and its report. The
pipeline's own ``__iter__``, ``state_dict``, ``load_state_dict`` and ``report`` delegate to it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from zephon.distributed import startup
from zephon.engine.agreement import RoundAgreement, check_agreement_group
from zephon.engine.dataset_source import Offload, projected_columns
from zephon.engine.document_threads import DocumentThreads
from zephon.engine.lane import LanePlan, restored_lane
from zephon.engine.loader_state import (
    STATE_VERSION,
    check_fingerprint,
    check_lanes,
    in_entry,
    lane_entries,
    lane_key,
    sealed_entry,
    to_portable,
)
from zephon.engine.rank import RankStream, rounds_ahead
from zephon.engine.rank_check import check_ranks_agree, plan_digests
from zephon.engine.transform import transform_documents
from zephon.engine.unit_reads import UnitReads
from zephon.engine.workers import DocumentWorkers
from zephon.errors import ConfigError, StateMismatchError
from zephon.loader_options import LoaderOptions, lanes_problem
from zephon.logs import get_logger
from zephon.ops.base import (
    BuildContext,
    DocumentOperator,
    OperatorSpec,
    RowOperator,
    applies_to,
    check_chain,
)
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackSpec
from zephon.progress import progress
from zephon.records import Doc
from zephon.report import PipelineReport, StageReport, build_report, sum_stats
from zephon.sample_batch import SampleBatch
from zephon.work.estimation import DatasetEstimate, TokenEstimation, estimate_dataset
from zephon.work.protocol import WorkSource

log = get_logger(__name__)


class Loader:
    """One rank's view of a built pipeline; see the module docstring."""

    def __init__(self, work_source: WorkSource, specs: Sequence[OperatorSpec],
                 options: LoaderOptions):
        # Every rank builds its runtime at once: a failure here reaches the peers waiting on
        # this rank (zephon.distributed.startup) instead of leaving them in a collective.
        with startup(options.startup_timeout_s):
            self._build(work_source, specs, options)

    def _build(self, work_source: WorkSource, specs: Sequence[OperatorSpec],
               options: LoaderOptions) -> None:
        check_chain(specs, work_source.names())
        self.options = options
        self.start_step = options.start_step
        """The trainer's step when this data began (kept in the state, for traces)."""
        self.earlier_microbatches = 0
        """Global microbatches of the earlier passes over the data since then (a data that
        ended and was started over: ``reset``), kept in the state for traces."""
        world = options.dp_world_size
        if options.lanes is None and world > 1:
            warnings.warn(
                f"zephon: lanes is not set, so it equals dp_world_size={world}; changing "
                "the number of data-parallel ranks will then change the data. Set "
                "options(lanes=...) to a multiple of every size you may use.", stacklevel=4)
        self.lanes = options.resolved_lanes
        problem = lanes_problem(self.lanes, world)
        if problem:
            raise ConfigError(f"{problem}; dp_world_size={world}, lanes={self.lanes}")
        if work_source.by_tokens and not any(s.makes_tokens for s in specs):
            raise ConfigError("token_estimation (mixing by tokens) needs tokenize(...)")
        check_agreement_group(options.process_group)
        context = BuildContext(seed=work_source.seed, lanes=self.lanes)
        built = [spec.build(context) for spec in specs]
        self.specs = list(specs)
        self.document_ops = tuple(op for op in built if isinstance(op, DocumentOperator))
        self._row_ops = tuple(op for op in built if isinstance(op, RowOperator))
        self._op_fingerprints = [op.fingerprint() for op in built]
        self._titles = [spec.title for spec in specs]
        self.state_loaded = False
        names = work_source.names()
        ops_by_dataset = {i: [op for op in self.document_ops if applies_to(op.spec, name)]
                          for i, name in enumerate(names)}
        self.workers: Offload | None = None
        if options.workers:
            self.workers = DocumentWorkers(ops_by_dataset, options.workers)
        elif options.prefetch > 0:
            self.workers = DocumentThreads(ops_by_dataset)
        self.unit_reads = UnitReads()
        self._use_source(work_source.bound(options.io_options))
        # The ranks must also agree on the mixture, which the resume fingerprint leaves to
        # the lanes (a resume may change its future).
        check_ranks_agree(
            lambda: {**self._fingerprint, "mixture": self.source.schedule.describe()},
            options.dp_rank, world, options.process_group, self._titles)

    def _use_source(self, source: WorkSource) -> None:
        """Plan the lanes over ``source`` and start a fresh stream."""
        self.source = source
        self.plan = LanePlan(source, self.document_ops, self._row_ops,
                             any(s.makes_rows for s in self.specs), self.lanes, self.workers,
                             self.unit_reads)
        source.work(self.lanes)
        self._fingerprint = {
            "version": STATE_VERSION,
            "lanes": self.lanes,
            "work_source": source.fingerprint(),
            "ops": self._op_fingerprints,
            # The units follow from the files and options above; fingerprints are compared
            # in key order, so a change of files is named before the units it changes.
            "work_units": plan_digests(source, self.lanes),
        }
        options = self.options
        owned = self.lanes // options.dp_world_size
        per_microbatch = microbatch_tokens(self.specs)
        self.stream = RankStream(
            self.plan, options.dp_rank, options.dp_world_size, options.prefetch,
            RoundAgreement(options.dp_world_size, options.process_group),
            rounds_ahead(options.read_ahead_tokens,
                         per_microbatch * owned if per_microbatch else None))

    def _follow_moved_branches(self, saved: dict[str, Any]) -> None:
        """Re-pin Hub datasets whose branch moved since ``saved`` (a state fingerprint) to
        the checkpoint's commit, when the storage options allow it."""
        pin = getattr(self.source, "at_checkpoint_commits", None)
        if not self.options.io_options.resume_on_checkpoint_commit or pin is None:
            return
        pinned = pin(saved)
        if pinned is not None:
            self._use_source(pinned)

    def check_state(self, state: dict[str, Any]) -> None:
        """The checks of :meth:`load_state_dict` that read no data, for a preflight: every
        entry's fields, its fingerprint against this pipeline's and the lane count. A Hub
        dataset whose branch moved counts as at the checkpoint's commit where the storage
        options resume there (as :meth:`load_state_dict` re-pins it). Raises
        StateMismatchError naming the entry and what changed; changes nothing."""
        entries = lane_entries(state)
        current = copy.deepcopy(self._fingerprint)
        pinned = getattr(self.source, "fingerprint_at_checkpoint_commits", None)
        if self.options.io_options.resume_on_checkpoint_commit and pinned is not None:
            saved = next(iter(entries.values()))["fingerprint"]
            current["work_source"] = pinned(saved)
        for lane, entry in entries.items():
            check_fingerprint(entry["fingerprint"], current, lane_key(lane), self._titles)
        check_lanes(entries, self.lanes)

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[SampleBatch]:
        return iter(self.stream)

    def reset(self) -> None:
        """Start over from the beginning of the data at the next ``iter()``."""
        stream = self.stream
        self.earlier_microbatches += stream.consumed_global
        stream.reset_to(dict.fromkeys(stream.owned), 0, False, dict.fromkeys(stream.leftover, 0))
        self.state_loaded = False

    def fingerprint(self) -> dict[str, Any]:
        return copy.deepcopy(self._fingerprint)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": entry}`` for the lanes this rank owns; see
        :mod:`zephon.engine.loader_state`.

        Describes what the caller has consumed; prefetched microbatches are not in it.
        """
        stream = self.stream
        out = {}
        for lane in stream.owned:
            out[lane_key(lane)] = sealed_entry({
                "version": STATE_VERSION,
                "lane": lane,
                "fingerprint": to_portable(self._fingerprint),
                "consumed_global": stream.consumed_global,
                "finished": stream.finished,
                "leftover": dict(stream.leftover) if lane == stream.owned[0] else None,
                "start_step": self.start_step,
                "earlier_microbatches": self.earlier_microbatches,
                # The data-parallel size that wrote it, for traces (any size resumes it).
                "dp_world_size": self.options.dp_world_size,
                "tail_from": stream.tail_from,
                "lane_state": to_portable(stream.consumed[lane]),
            })
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``: entries for (at least) this rank's lanes, written at any
        data-parallel size that divides the lane count. Extra lanes' entries are ignored.

        Any consumed count ``s`` resumes, whatever the size now: the next global microbatches
        are ``s, s + 1, ...`` and rank ``r`` takes those with ``m % W == r`` (its lanes, since
        ``W`` divides ``L``), so a run checkpointed after 10 microbatches at 2 ranks goes on at
        4 ranks with ranks 2 and 3 taking microbatches 10 and 11.

        Nothing in ``state`` is trusted. Every entry must have the fields and types a loader
        writes, the fingerprint of this pipeline and the lane of its key; the entries must
        agree on the consumed count. Each lane this rank owns is restored into a fresh lane
        first, whose nodes check every field against the plan (positions within the units the
        lane reads, counts that agree), and a lane marked finished must be at its end. Other
        lanes' states are checked by the ranks that own them. Any misfit raises a
        StateMismatchError naming the entry and field, before any iteration, and leaves the
        loader as it was."""
        entries = lane_entries(state)
        world, rank = self.options.dp_world_size, self.options.dp_rank
        previous = (self.source, self.plan, self._fingerprint, self.stream)
        try:
            self._follow_moved_branches(next(iter(entries.values()))["fingerprint"])
            for lane, entry in entries.items():
                check_fingerprint(entry["fingerprint"], self._fingerprint, lane_key(lane),
                                  self._titles)
            check_lanes(entries, self.lanes)
            stream = self.stream
            missing = [lane_key(lane) for lane in stream.owned if lane not in entries]
            if missing:
                raise StateMismatchError(
                    f"loader state lacks {missing} needed by rank {rank} of {world}; it holds "
                    f"{sorted(map(lane_key, entries))}. Merge the states of all ranks before "
                    "loading at another data-parallel size.")
            consumed = {e["consumed_global"] for e in entries.values()}
            if len(consumed) != 1:
                raise StateMismatchError(f"loader state entries disagree on how many "
                                         f"microbatches were consumed ({sorted(consumed)}); "
                                         "they come from different steps")
            total = consumed.pop()
            starts = {(e["start_step"], e["earlier_microbatches"]) for e in entries.values()}
            if len(starts) != 1:
                raise StateMismatchError(f"loader state entries disagree on where their data "
                                         f"began (start_step, earlier_microbatches: "
                                         f"{sorted(starts)}); they come from different runs")
            tails = {e["tail_from"] for e in entries.values()}
            if len(tails) != 1:
                raise StateMismatchError(f"loader state entries disagree on where the last "
                                         f"round of the data began (tail_from: "
                                         f"{sorted(tails, key=str)}); they come from different "
                                         "steps")
            tail_from = tails.pop()
            if tail_from is not None and (tail_from % self.lanes or not 0 <= tail_from <= total):
                raise StateMismatchError(
                    f"loader state: tail_from is {tail_from}, but the last round begins at a "
                    f"whole round ({self.lanes} lanes) at or before the {total} microbatches "
                    "consumed")
            lane_states = {lane: self._checked_lane(lane, entries[lane], total, tail_from)
                           for lane in stream.owned}
        except BaseException:
            self.source, self.plan, self._fingerprint, self.stream = previous
            raise
        if stream is not previous[3]:
            previous[3].close()
        finished = any(e["finished"] for e in entries.values())
        leftover = next((e["leftover"] for e in entries.values() if e["leftover"]),
                        dict.fromkeys(stream.leftover, 0))
        stream.reset_to(lane_states, total, finished, dict(leftover),
                        None if finished else tail_from)
        # The stream the state continues began there.
        self.start_step, self.earlier_microbatches = starts.pop()
        self.state_loaded = True

    def _checked_lane(self, lane: int, entry: dict[str, Any], total: int,
                      tail_from: int | None) -> dict[str, Any] | None:
        """The decoded state of ``lane``'s entry, restored once into a fresh lane whose nodes
        check it. Its consumed microbatches must be those that ``total`` implies (in the last
        round, those of the rounds before it), unless the entry is finished; then the lane
        must be at its end."""
        key = lane_key(lane)
        saved, trial = None, None
        with in_entry(key):
            if entry["lane_state"] is not None:
                saved, trial = restored_lane(self.plan, lane, entry["lane_state"])
        done = saved["microbatches"] if saved else 0
        expected = max(0, -(-(total - lane) // self.lanes)) if tail_from is None \
            else tail_from // self.lanes
        if done != expected and not entry["finished"]:
            raise StateMismatchError(f"loader state {key!r} has {done} microbatches consumed, "
                                     f"but {total} global microbatches imply {expected}"
                                     + ("" if tail_from is None else " (the last round of the "
                                        f"data began at microbatch {tail_from})"))
        if entry["finished"] and not (trial and trial.drained):
            raise StateMismatchError(f"loader state {key!r}: finished is true, but lane_state "
                                     "is not at the end of the lane's data")
        return saved

    # -- reporting -------------------------------------------------------------------------
    def estimate(self) -> list[DatasetEstimate]:
        """Estimated documents and tokens per dataset (see :mod:`zephon.work.estimation`).

        Uses the work source's ``token_estimation`` (``measure`` when it has none); a work
        source without datasets to sample (``datasets``) has no estimates."""
        if not hasattr(self.source, "datasets"):
            raise ConfigError(f"{type(self.source).__name__} has no datasets to sample, so "
                              "it has no token estimates")
        spec = getattr(self.source, "token_estimation", None) or TokenEstimation()
        out = []
        for i, name in enumerate(progress(self.source.names(), desc="estimating tokens",
                                          unit="dataset")):
            ops = [op for op in self.document_ops if applies_to(op.spec, name)]
            measure = _measure(ops) if any(op.spec.makes_tokens for op in ops) else None
            out.append(estimate_dataset(self.source, i, self.lanes, projected_columns(ops),
                                        measure, spec))
        return out

    def report(self) -> PipelineReport:
        """Counts for this rank's lanes, as of the last consumed microbatch.

        ``documents`` and ``tokens`` count what the lanes had read by then (including what
        waits in open rows or the shuffle buffer), ``handed_documents`` and ``handed_tokens``
        what the trainer received; realized shares and padding are of what it received. Rows
        dropped at a flush and microbatches left over at the end of data are counted apart."""
        stream = self.stream
        snapshots = [s for s in (stream.consumed[lane] for lane in stream.owned) if s]
        stats = sum_stats(_node_stats(s["nodes"]) for s in snapshots)
        source = self.source
        report = build_report(
            stats, source.names() + source.unused,
            [*self._target_shares(stats), *[0.0] * len(source.unused)], source.by_tokens,
            sum(s["microbatches"] for s in snapshots), stream.leftover, stream.finished,
            {work.name: work.skipped_files() for work in source.work(self.lanes)})
        report.lanes, report.total_lanes = tuple(stream.owned), self.lanes
        report.stages = self._stage_reports(stats)
        return report

    def _stage_reports(self, stats: dict[str, Any]) -> list[StageReport]:
        """The stages the lanes reached: each one's target shares over the span reached (job
        position: what the mixers handed on, times the lanes over the lanes counted) and the
        shares of what the mixers handed on in it."""
        schedule = self.source.schedule
        by_stage = stats.get("stages")
        if schedule.static or not by_stage:
            return []
        scale = self.lanes / len(self.stream.owned)
        position = sum(stats.get("tokens", {}).values()) * scale
        out = []
        for key in sorted(by_stage, key=int):
            stage = int(key)
            begins = schedule.stage_boundary(stage)
            until = schedule.stages[stage].until_tokens
            reached = min(position, until) if until is not None else position
            span = max(reached - begins, 1e-9)
            target = [(b - a) / span for a, b in zip(schedule.targets(begins),
                                                      schedule.targets(reached), strict=True)]
            counts = by_stage[key]
            total = sum(counts.values()) or 1
            out.append(StageReport(stage + 1, int(begins), int(reached),
                                   dict(zip(schedule.names, target, strict=True)),
                                   {n: counts.get(n, 0) / total for n in schedule.names}))
        return out

    def _target_shares(self, stats: dict[str, Any]) -> list[float]:
        """Each dataset's target share of what this rank's lanes handed out: a static
        mixture's shares, or a schedule's integral up to the job position they stand for
        (what they handed times the lanes over the lanes counted) over that position."""
        source = self.source
        schedule = source.schedule
        position = _handed(stats, source.by_tokens) * self.lanes / len(self.stream.owned)
        if schedule.static or position <= 0:
            first = dict(zip(schedule.names, schedule.shares_at(0), strict=True))
            return [float(first.get(name, 0.0)) for name in source.names()]
        targets = dict(zip(schedule.names, schedule.targets(position), strict=True))
        return [targets.get(name, 0.0) / position for name in source.names()]


def _handed(stats: dict[str, Any], by_tokens: bool) -> int:
    handed = stats.get("handed", {}).get("tokens" if by_tokens else "documents", {})
    return sum(handed.values())


def microbatch_tokens(specs: Sequence[OperatorSpec]) -> int | None:
    """Tokens in one microbatch when rows have a fixed length (flat packing then batching),
    else None."""
    pack = next((s for s in specs if isinstance(s, PackSpec) and s.flat), None)
    batch = next((s for s in specs if isinstance(s, BatchSpec)), None)
    if pack is None or batch is None:
        return None
    return pack.max_length * batch.microbatch_size


def _measure(ops: Sequence[DocumentOperator]) -> Any:
    """Tokens per sampled row after ``ops`` (0 for a row they drop)."""

    def measure(rows: list[dict[str, Any]], labels: list[Any]) -> list[int]:
        docs = [Doc(None, "estimate", "", fields=row) for row in rows]
        return [sum(len(d.tokens) for d in outputs if d.tokens is not None)
                for outputs, _ in transform_documents(ops, docs, labels)]

    return measure


def _node_stats(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return sum_stats(node["stats"] for node in nodes if "stats" in node)
