"""Mixture schedules: target shares that change as training goes on.

A schedule is a list of stages. Each stage has target weights (normalized to shares) and runs
until a number of tokens handed to the trainer by the whole job (``until_tokens``; the last
stage runs to the end). A stage may begin with a ramp (``ramp_tokens``): its shares move
linearly from the previous stage's to its own over that many tokens, then hold. A dataset may
have no weight in some stages (it enters late, or leaves).

The shares at job token ``t`` are a piecewise-linear function ``w(t)``. What a dataset should
have delivered by ``t`` is its integral, ``W(t) = integral of w over [0, t]``, computed exactly
per segment; the mixer keeps each lane's delivered amounts close to these targets (see
:mod:`zephon.engine.mixer`), so over every stage each dataset's realized share tracks the
stage's weights, ramps included, within about half a document.

Job tokens from one lane: lanes are dealt microbatches round-robin, so when a lane's mixer has
handed on ``T`` tokens, the job has received about ``L * T`` from its ``L`` lanes. A lane uses
``L * T`` as the job position: a pure function of the lane, the same at every data-parallel
size, so stage boundaries fall on the same documents whatever the number of ranks (a boundary
lands within a packed row or a shuffle buffer of the tokens the trainer has received).

Changing the future: two schedules that agree on ``[0, t]`` (the same shares at every point up
to ``t``) trained the same data up to ``t``. :meth:`MixtureSchedule.differs_before` finds the
first point where they do not, so a resume can accept a schedule that differs only after the
resumed position and refuse one that changes what was already trained, naming the stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError
from zephon.work.mixture import normalized

MAX_TOKENS = 1 << 62
"""The most job tokens a stage boundary may name."""


@dataclass(frozen=True)
class Stage:
    """One stage of a :class:`MixtureSchedule`."""

    weights: Mapping[str, float]
    """Target weight of each dataset in the stage (normalized to shares; missing or 0: none
    of it)."""
    until_tokens: int | None = None
    """Tokens handed to the trainer by the whole job when the stage ends (None: the last
    stage, which runs to the end)."""
    ramp_tokens: int = 0
    """Tokens at the start of the stage over which the shares move linearly from the
    previous stage's to this one's (0: they change at once)."""


@dataclass(frozen=True)
class Divergence:
    """Where two schedules part (:meth:`MixtureSchedule.differs_before`)."""

    stage: int
    """The stage (of the schedule asked) in which they part."""
    begins: float
    """The job token from which they differ."""
    at: float
    """A job token where they differ, and the shares there: ``mine`` (the schedule asked)
    and ``theirs``."""
    mine: str
    theirs: str


@dataclass(frozen=True)
class _Segment:
    """Shares moving linearly from ``start`` (at ``begin``) to ``end`` (at ``stop``)."""

    begin: float
    stop: float  # math.inf for the last
    start: tuple[float, ...]
    end: tuple[float, ...]
    stage: int


class MixtureSchedule:
    """Stages of target shares over the job's tokens; see the module docstring."""

    def __init__(self, stages: Sequence[Stage | Mapping[str, Any]]):
        stages = [s if isinstance(s, Stage) else _stage(s, i) for i, s in enumerate(stages)]
        if not stages:
            raise ConfigError("MixtureSchedule needs at least one stage")
        names: list[str] = []
        for stage in stages:
            names += [n for n in stage.weights if n not in names]
        self.names = tuple(names)
        """Every dataset named by a stage, in order of first appearance."""
        self.stages = tuple(stages)
        self._shares = [self._check_stage(i, s) for i, s in enumerate(stages)]
        self._segments = self._build_segments()

    # -- checks ----------------------------------------------------------------------------
    def _check_stage(self, index: int, stage: Stage) -> tuple[float, ...]:
        where = f"mixture stage {index + 1}"
        last = index == len(self.stages) - 1
        if not isinstance(stage.weights, Mapping) or not stage.weights:
            raise ConfigError(f"{where}: weights must name datasets with their weights")
        bad = [f"weight of {name!r} must be a finite number >= 0, got {w!r}"
               for name, w in stage.weights.items()
               if not isinstance(w, (int, float)) or isinstance(w, bool)
               or not math.isfinite(w) or w < 0]
        if bad:
            raise ConfigError(f"{where}: " + "; ".join(bad))
        shares = dict(normalized([(str(n), float(w)) for n, w in stage.weights.items()]))
        if last and stage.until_tokens is not None:
            raise ConfigError(f"{where}: the last stage runs to the end; leave out "
                              f"until_tokens (it has {stage.until_tokens})")
        if not last and not _count(stage.until_tokens):
            raise ConfigError(f"{where}: until_tokens must be a positive number of tokens "
                              f"(every stage but the last ends somewhere), got "
                              f"{stage.until_tokens!r}")
        if not _count(stage.ramp_tokens, zero=True):
            raise ConfigError(f"{where}: ramp_tokens must be a number of tokens >= 0, got "
                              f"{stage.ramp_tokens!r}")
        if index == 0 and stage.ramp_tokens:
            raise ConfigError(f"{where}: the first stage has nothing to ramp from; leave out "
                              "ramp_tokens")
        begin = self.stages[index - 1].until_tokens if index else 0
        if stage.until_tokens is not None and stage.until_tokens <= (begin or 0):
            raise ConfigError(f"{where}: until_tokens = {stage.until_tokens} is not after "
                              f"the stage before it ends ({begin})")
        if stage.until_tokens is not None and stage.ramp_tokens > stage.until_tokens - begin:
            raise ConfigError(f"{where}: ramp_tokens = {stage.ramp_tokens} is longer than the "
                              f"stage ({stage.until_tokens - begin} tokens)")
        return tuple(shares.get(n, 0.0) for n in self.names)

    def _build_segments(self) -> list[_Segment]:
        segments = []
        begin = 0.0
        for index, (stage, shares) in enumerate(zip(self.stages, self._shares, strict=True)):
            stop = float(stage.until_tokens) if stage.until_tokens is not None else math.inf
            if stage.ramp_tokens:
                ramp_end = begin + stage.ramp_tokens
                segments.append(_Segment(begin, ramp_end, self._shares[index - 1], shares,
                                         index))
                begin = ramp_end
            if stop > begin:
                segments.append(_Segment(begin, stop, shares, shares, index))
            begin = stop
        return segments

    # -- shares ----------------------------------------------------------------------------
    @property
    def static(self) -> bool:
        """Whether there is one stage (the shares never change)."""
        return len(self.stages) == 1

    def stage_at(self, tokens: float) -> int:
        """The index of the stage that job token ``tokens`` falls in."""
        return self._segment(tokens).stage

    def stage_boundary(self, stage: int) -> float:
        """The job token at which ``stage`` begins."""
        return float(self.stages[stage - 1].until_tokens) if stage else 0.0

    def shares_at(self, tokens: float) -> tuple[float, ...]:
        """Target shares (in :attr:`names` order) at job token ``tokens``."""
        segment = self._segment(tokens)
        if segment.start == segment.end:
            return segment.start
        f = (tokens - segment.begin) / (segment.stop - segment.begin)
        return tuple(a + (b - a) * f for a, b in zip(segment.start, segment.end, strict=True))

    def targets(self, tokens: float) -> tuple[float, ...]:
        """What each dataset should have delivered by job token ``tokens``: the integral of
        its share over ``[0, tokens]``."""
        out = [0.0] * len(self.names)
        for segment in self._segments:
            if tokens <= segment.begin:
                break
            upto = min(tokens, segment.stop)
            span = upto - segment.begin
            if segment.start == segment.end:
                for j, share in enumerate(segment.start):
                    out[j] += share * span
                continue
            length = segment.stop - segment.begin
            for j, (a, b) in enumerate(zip(segment.start, segment.end, strict=True)):
                slope = (b - a) / length
                out[j] += a * span + slope * span * span / 2
        return tuple(out)

    def _segment(self, tokens: float) -> _Segment:
        for segment in self._segments:
            if tokens < segment.stop:
                return segment
        return self._segments[-1]

    # -- the past and the future -----------------------------------------------------------
    def differs_before(self, other: MixtureSchedule, tokens: float) -> Divergence | None:
        """Where ``other``'s shares first differ from these at or before job token
        ``tokens`` (None: they agree on ``[0, tokens]``). Both are piecewise linear, so
        comparing them at every breakpoint of either (both sides of it) and at ``tokens``
        decides it, and finds where they part: at a breakpoint where one jumps, else just
        after the last breakpoint where they agreed."""
        names = sorted(set(self.names) | set(other.names))
        points = sorted({0.0, float(tokens), *(p for s in (self, other)
                                                for g in s._segments
                                                for p in (g.begin, g.stop)
                                                if p <= tokens)})
        def differ(edge: float) -> Divergence | None:
            mine = dict(zip(self.names, self.shares_at(edge), strict=True))
            theirs = dict(zip(other.names, other.shares_at(edge), strict=True))
            if all(abs(mine.get(n, 0.0) - theirs.get(n, 0.0)) <= 1e-12 for n in names):
                return None
            return Divergence(self.stage_at(edge), agreed, edge, _shown(mine), _shown(theirs))

        agreed = 0.0  # the last breakpoint where they agreed: they part after it
        for point in points:
            left = differ(math.nextafter(point, -math.inf)) if point > 0 else None
            if left is not None:  # apart inside (agreed, point)
                return left
            agreed = point  # the left side agreed: a difference at the point is a jump there
            found = differ(point)
            if found is not None:
                return found
        return None

    def describe(self) -> list[dict[str, Any]]:
        """The stages as plain data (what recipes write, reports and states show)."""
        return [{"weights": dict(zip(self.names, shares, strict=True)),
                 "until_tokens": stage.until_tokens, "ramp_tokens": stage.ramp_tokens}
                for stage, shares in zip(self.stages, self._shares, strict=True)]

    @classmethod
    def from_plain(cls, stages: Any, where: str) -> MixtureSchedule:
        """A schedule from :meth:`describe` data (a loader state's), a ConfigError naming
        ``where`` when it is not one."""
        if not isinstance(stages, list):
            raise ConfigError(f"{where} is {stages!r}, not a list of stages")
        try:
            return cls([_stage(s, i) for i, s in enumerate(stages)])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixtureSchedule) and self.describe() == other.describe()

    __hash__ = None  # type: ignore[assignment]


def _stage(value: Any, index: int) -> Stage:
    if not isinstance(value, Mapping):
        raise ConfigError(f"mixture stage {index + 1} must be a table of weights, "
                          f"until_tokens and ramp_tokens, got {value!r}")
    unknown = sorted(set(value) - {"weights", "until_tokens", "ramp_tokens"})
    if unknown:
        raise ConfigError(f"mixture stage {index + 1}: unknown key(s) {unknown} (known: "
                          "weights, until_tokens, ramp_tokens)")
    return Stage(value.get("weights"), value.get("until_tokens"),  # type: ignore[arg-type]
                 value.get("ramp_tokens", 0) or 0)


def _count(value: Any, zero: bool = False) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and (0 if zero else 1) <= value <= MAX_TOKENS)


def _shown(shares: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{n}: {w:.3g}" for n, w in shares.items() if w) + "}"
