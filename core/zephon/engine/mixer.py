"""Exact mixing: each document from the dataset that keeps the lane closest to its target.

Amounts are tokens after tokenization (token mixing) or documents. After ``T`` of them, dataset
``c`` should have delivered ``w_c * T``.

- **By documents** every candidate adds one, so the mixer takes the dataset furthest below its
  target, ``argmax_c(w_c * T - delivered_c)`` (ties to the lowest index): every dataset stays
  within one document of its target at every point.
- **By tokens** documents differ in length (a 200-token web page beside a 2,000-token source
  file), and the dataset furthest below its target may be far above it once its next document
  is added: taken at the start of a lane, one long document makes the lane's first
  microbatches lean to its dataset, and every lane of a run leans the same way at once. So
  the mixer looks at the next document of every dataset still in the mixture (read ahead
  anyway) and takes the one after which the lane is closest to its targets:
  ``argmin_c sum_j |delivered_j + [j = c] s_c - w_j (T + s_c)|`` for next-document sizes
  ``s_c`` (ties to the lowest index). Each dataset then stays within about half of its
  longest document of its target, and lanes no longer lean alike at their start: against
  taking the dataset furthest below its target, the job's share error over its first
  microbatches fell at every point compared (``benchmarks/share_error.py``; measured:
  docs/measurements.md).

When a dataset runs out (its next document is None, seen when the mixer looks at it) the lane
stops (``on_exhausted="stop"``) or goes on without it (``"drain"``), the remaining weights
renormalized. Plain Python on purpose: with a handful of datasets a choice costs less than
numpy's call overhead alone would (measured: docs/measurements.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from zephon import field_checks as checks
from zephon.engine.dataset_source import DatasetSource
from zephon.errors import ConfigError
from zephon.ops.base import Node
from zephon.records import Doc
from zephon.work.schedule import MixtureSchedule


class MixTargets:
    """What each dataset of a lane should have delivered after ``T`` of its tokens (or
    documents): the schedule's integral of shares at job position ``lanes * T`` (see
    :mod:`zephon.work.schedule`), over ``lanes``; with one stage, ``shares * T``. ``names``
    orders the datasets as the lane's sources are."""

    def __init__(self, schedule: MixtureSchedule, names: Sequence[str], lanes: int):
        self.schedule, self.lanes = schedule, lanes
        index = {name: i for i, name in enumerate(schedule.names)}
        self._order = [index.get(name) for name in names]
        self.static = schedule.static
        self._fixed = self._pick(schedule.shares_at(0)) if self.static else None

    def _pick(self, values: Sequence[float]) -> list[float]:
        return [values[i] if i is not None else 0.0 for i in self._order]

    def shares(self, amount: float) -> list[float]:
        """Target shares at the lane's ``amount``."""
        if self._fixed is not None:
            return self._fixed
        return self._pick(self.schedule.shares_at(amount * self.lanes))

    def targets(self, amount: float) -> list[float]:
        """What each dataset should have delivered by the lane's ``amount``."""
        if self._fixed is not None:
            return [share * amount for share in self._fixed]
        lanes = self.lanes
        return [t / lanes for t in self._pick(self.schedule.targets(amount * lanes))]


class DeficitMixer:
    """The delivered amounts of a lane's datasets against :class:`MixTargets`, and the choice
    of the next dataset (see the module docstring)."""

    def __init__(self, targets: MixTargets):
        self.plan = targets
        n = len(targets._order)
        self.delivered = [0] * n
        self.active = [True] * n
        self._sole: int | None = None
        self._update_sole()

    def _update_sole(self) -> None:
        live = [i for i, a in enumerate(self.active) if a]
        self._sole = live[0] if len(live) == 1 else None

    def snapshot(self) -> dict[str, Any]:
        return {"delivered": list(self.delivered), "active": list(self.active)}

    def restore(self, state: dict[str, Any]) -> None:
        state = checks.need_fields(state, "", ("delivered", "active"))
        n = len(self.delivered)
        delivered = checks.need_list(state["delivered"], "delivered", n)
        active = checks.need_list(state["active"], "active", n)
        self.delivered = [checks.need_int(x, checks.item("delivered", i))
                          for i, x in enumerate(delivered)]
        self.active = [checks.need_bool(x, checks.item("active", i))
                       for i, x in enumerate(active)]
        self._update_sole()

    def goals(self, total: float) -> list[float]:
        """What each active dataset should have delivered at ``total``. Once a dataset has
        left (drain), the others split the total by their current shares, renormalized."""
        if all(self.active):
            return self.plan.targets(total)
        shares = [s if a else 0.0 for s, a in zip(self.plan.shares(total), self.active,
                                                  strict=True)]
        norm = sum(shares)
        if norm <= 0:  # only datasets without a share now are left: share the rest evenly
            shares, norm = [1.0 if a else 0.0 for a in self.active], float(sum(self.active))
        return [s / norm * total for s in shares] if norm > 0 else [0.0] * len(shares)

    def candidates(self) -> list[bool]:
        """The datasets the next document may come from: those still in the mixture with a
        share now (any still in it, where none has)."""
        total = float(sum(self.delivered))
        shares = self.plan.shares(total)
        wanted = [a and s > 0 for a, s in zip(self.active, shares, strict=True)]
        return wanted if any(wanted) else list(self.active)

    def choose(self) -> int | None:
        """By documents: the dataset furthest below its target (ties to the lowest index)."""
        if self._sole is not None:  # one dataset left (or only one): no deficit to compare
            return self._sole
        total = float(sum(self.delivered))
        goals = self.goals(total)
        best, best_deficit = None, 0.0
        for index, (goal, delivered, open_) in enumerate(
                zip(goals, self.delivered, self.candidates(), strict=True)):
            if not open_:
                continue
            deficit = goal - delivered
            if best is None or deficit > best_deficit:
                best, best_deficit = index, deficit
        return best

    def closest(self, sizes: Sequence[int | None]) -> int:
        """The dataset whose next document, of ``sizes[c]`` (None: not a candidate), leaves
        the delivered amounts closest to their targets (see the module docstring)."""
        delivered = self.delivered
        total = float(sum(delivered))
        best, best_error = -1, 0.0
        for index, size in enumerate(sizes):
            if size is None:
                continue
            goals = self.goals(total + size)
            error = 0.0
            for j, (goal, amount) in enumerate(zip(goals, delivered, strict=True)):
                error += abs(amount + (size if j == index else 0) - goal)
            if best < 0 or error < best_error:
                best, best_error = index, error
        return best

    def record(self, index: int, amount: int) -> None:
        self.delivered[index] += amount

    def deactivate(self, index: int) -> None:
        self.active[index] = False
        self._update_sole()


class MixNode(Node):
    """The lane's documents: the deficit mixer's choice among the dataset sources.

    ``on_exhausted="stop"`` ends the lane when the chosen dataset has run out; ``"drain"``
    drops that dataset from the mixture and goes on with the others. Counts per dataset the
    documents (first pieces) and tokens it hands on.
    """

    def __init__(self, sources: list[DatasetSource], schedule: MixtureSchedule, by_tokens: bool,
                 on_exhausted: str, lanes: int = 1):
        self.sources = sources
        self.schedule, self.lanes = schedule, lanes
        self.mixer = DeficitMixer(MixTargets(schedule, [s.name for s in sources], lanes))
        self.by_tokens = by_tokens
        self.stop_when_one_ends = on_exhausted == "stop"
        names = [s.name for s in sources]
        self.documents = dict.fromkeys(names, 0)
        self.tokens = dict.fromkeys(names, 0)
        self.by_stage: dict[str, dict[str, int]] | None = None if schedule.static else {}
        """Tokens handed on per stage (its index, as text) and dataset, where the mixture
        has stages."""
        self._ended = False

    def next(self) -> Doc | None:
        while not self._ended:
            index = self._token_choice() if self.by_tokens else self.mixer.choose()
            if index is None:
                break
            source = self.sources[index]
            doc = source.next()
            if doc is None:
                if self.stop_when_one_ends:
                    break
                self.mixer.deactivate(index)
                continue
            first = doc.doc_start == 0
            if doc.tokens is None:
                self.documents[source.name] += 1
                self.mixer.record(index, 1)
                return doc
            tokens = len(doc.tokens)
            if self.by_stage is not None:
                stage = str(self.schedule.stage_at(self.lanes * sum(self.mixer.delivered)))
                counts = self.by_stage.setdefault(stage, dict.fromkeys(self.documents, 0))
                counts[source.name] += tokens
            self.tokens[source.name] += tokens
            self.documents[source.name] += first
            self.mixer.record(index, tokens if self.by_tokens else int(first))
            return doc
        self._ended = True
        return None

    def _token_choice(self) -> int | None:
        """By tokens: the dataset whose next document keeps the lane closest to its targets,
        each active dataset's next document looked at (read ahead). A dataset found without
        one is returned, for :meth:`next` to end the lane or drop it from the mixture."""
        mixer = self.mixer
        if mixer._sole is not None:
            return mixer._sole
        sizes: list[int | None] = []
        for index, (source, wanted) in enumerate(zip(self.sources, mixer.candidates(),
                                                     strict=True)):
            if not wanted:
                sizes.append(None)
                continue
            doc = source.peek()
            if doc is None:
                return index
            sizes.append(len(doc.tokens) if doc.tokens is not None else 1)
        return mixer.closest(sizes) if any(s is not None for s in sizes) else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "mixer": self.mixer.snapshot(),
            "schedule": self.schedule.describe(),
            "sources": [s.snapshot() for s in self.sources],
            "ended": self._ended,
            "stats": {"documents": dict(self.documents), "tokens": dict(self.tokens),
                      "skipped": {s.name: dict(s.skipped) for s in self.sources},
                      **({"stages": {k: dict(v) for k, v in self.by_stage.items()}}
                         if self.by_stage is not None else {})},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, refused unless it is one the mixer could have written:
        see :meth:`_check_counts` and :meth:`_check_active`."""
        state = checks.need_fields(state, "", ("mixer", "schedule", "sources", "ended", "stats"))
        saved = checks.need_list(state["sources"], "sources", len(self.sources))
        for i, (source, part) in enumerate(zip(self.sources, saved, strict=True)):
            with checks.within(checks.item("sources", i)):
                source.restore(part)
        with checks.within("mixer"):
            self.mixer.restore(state["mixer"])
        self._check_past(state["schedule"])
        ended = checks.need_bool(state["ended"], "ended")
        names = [s.name for s in self.sources]
        stats = checks.need_fields(state["stats"], "stats", ("documents", "tokens", "skipped"),
                            ("stages",))
        documents = checks.need_counts(stats["documents"], "stats.documents", names)
        tokens = checks.need_counts(stats["tokens"], "stats.tokens", names)
        by_stage = self._stage_counts(stats.get("stages"), tokens)
        self._check_counts(documents, tokens, checks.need_fields(stats["skipped"], "stats.skipped",
                                                          names))
        self._check_active(ended)
        self._ended = ended
        self.documents = documents
        self.tokens = tokens
        self.by_stage = by_stage

    def _stage_counts(self, saved: Any, tokens: dict[str, int]
                      ) -> dict[str, dict[str, int]] | None:
        """The per-stage counts of a state, each a stage of this mixture, adding up to the
        tokens counted per dataset. A state written with one stage, resumed with stages
        (whose first one it was still in), counts all it read in the first."""
        if self.by_stage is None:
            return None
        if saved is None:
            return {"0": dict(tokens)}
        counts = {stage: checks.need_counts(part, checks.join("stats.stages", stage),
                                            list(tokens))
                  for stage, part in checks.need_dict(saved, "stats.stages").items()}
        for stage in counts:
            if stage not in {str(i) for i in range(len(self.schedule.stages))}:
                raise checks.StateFieldError(checks.join("stats.stages", stage),
                                             "is not a stage of this mixture")
        for name, total in tokens.items():
            if sum(part[name] for part in counts.values()) != total:
                raise checks.StateFieldError("stats.stages", f"counts {name!r} otherwise than "
                                                             f"stats.tokens ({total})")
        return counts

    def _check_past(self, saved: Any) -> None:
        """The schedule the state was written under must give the same shares as this one
        up to where the lane stands (job position: lanes x what its mixer delivered); what
        comes after may change (see :mod:`zephon.work.schedule`)."""
        try:
            before = MixtureSchedule.from_plain(saved, "schedule")
        except ConfigError as exc:
            raise checks.StateFieldError("schedule", f"is not a mixture schedule: {exc}") from None
        position = self.lanes * sum(self.mixer.delivered)
        found = self.schedule.differs_before(before, position)
        if found is not None:
            unit = "token" if self.by_tokens else "document"
            raise checks.StateFieldError(
                "schedule", f"is the mixture the run trained with, and stage "
                f"{found.stage + 1} of this one differs from it from job {unit} "
                f"{math.ceil(found.begins):,} (at {math.ceil(found.at):,}: shares "
                f"{found.mine} here, {found.theirs} in the run), before the point the run "
                f"had reached (this lane stands at {position:,}). What was trained cannot "
                "change; change only the stages after it")

    def _check_counts(self, documents: dict[str, int], tokens: dict[str, int],
                      skipped: dict[str, Any]) -> None:
        """The mixer's delivered amounts are the counts of what it handed on (tokens when
        mixing by tokens, else documents); the skipped counts are the sources' own."""
        amounts, unit = (tokens, "tokens") if self.by_tokens else (documents, "documents")
        for i, source in enumerate(self.sources):
            name = source.name
            if self.mixer.delivered[i] != amounts[name]:
                raise checks.StateFieldError(
                    checks.item("mixer.delivered", i), f"is {self.mixer.delivered[i]}, but "
                    f"stats.{unit}.{name} is {amounts[name]}: both count what {name!r} "
                    "delivered")
            path = checks.join("stats.skipped", name)
            if checks.need_dict(skipped[name], path) != source.skipped:
                raise checks.StateFieldError(path, f"is {skipped[name]}, but sources[{i}].skipped "
                                            f"is {source.skipped}: both count the same drops")

    def _check_active(self, ended: bool) -> None:
        """With ``stop`` no dataset leaves the mixture (the lane ends instead); with
        ``drain`` the lane ends exactly when the last one has left."""
        active = self.mixer.active
        if self.stop_when_one_ends and not all(active):
            raise checks.StateFieldError(checks.item("mixer.active", active.index(False)),
                                  "is false, but with on_exhausted='stop' no dataset leaves "
                                  "the mixture")
        if not self.stop_when_one_ends and ended == any(active):
            raise checks.StateFieldError("ended", f"is {'true' if ended else 'false'}, but "
                                  + ("datasets are still in the mixture (mixer.active)" if ended
                                     else "no dataset is left in the mixture (mixer.active)"))

