"""``StaticMixtureWorkSource``: which documents each lane reads, in which order.

Algorithm. Every dataset is split into work units (see :mod:`zephon.io.formats`), at least
``4 * lanes`` of them where the files allow, so lanes stay balanced within about a quarter of a
unit. For epoch ``e`` the units of dataset ``d`` are permuted with a generator seeded by
``(seed, d, e)``; concatenating the epochs gives an endless sequence ``U`` of units in which
each epoch visits every unit once. Lane ``l`` of ``L`` reads ``U[l], U[l + L], U[l + 2L], ...``,
so a lane depends on ``L`` and the seed but never on the number of ranks. Inside a unit the
rows are read in an order permuted by ``(seed, d, e, unit)``.

A dataset that is not repeated stops after its first epoch. What a lane does then is
``on_exhausted``: ``"stop"`` ends the lane (mixture shares stay exact; what the other datasets
still hold is not read), ``"drain"`` goes on with the remaining
datasets (every document is read once; shares drift at the end). ``repeat`` names datasets
(or ``True`` for all) that start a new epoch, reshuffled, instead; that is how a small dataset
is upsampled. Defaults: nothing repeats, ``on_exhausted="stop"``, units and rows shuffled.

Mixing is by documents unless ``token_estimation`` is given, then by tokens; see
:mod:`zephon.engine.mixer`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.io.dataset import Dataset
from zephon.io.formats import PlanHints, UnitSpec
from zephon.io.store_options import StoreOptions
from zephon.io.unit_table import KINDS, UnitTable
from zephon.logs import get_logger
from zephon.work.dataset_work import PlannedDataset
from zephon.work.estimation import TokenEstimation
from zephon.work.mixture import MixtureSpec
from zephon.work.schedule import MixtureSchedule, Stage

log = get_logger(__name__)

EXHAUSTION = ("stop", "drain")
UNITS_PER_LANE = 4
"""Units per lane a repeated dataset is cut into, at least (where its files allow)."""
EPOCH_UNITS_PER_LANE = 16
"""Units per lane a dataset read once is cut into, at least, where cutting is cheap (byte
ranges of JSON Lines, row ranges of Arrow files and indexed datasets): the lanes, dealt units
balanced by size (:meth:`StaticMixtureWorkSource._dealt`), end within about one unit of each
other, and the run ends with the first lane, so finer units leave less of the epoch unread.
Parquet units stay row groups: a row range decodes its whole group."""


def units_per_lane(repeated: bool, files: Sequence[Any] = ()) -> int:
    """The least units per lane a dataset of ``files`` is cut into (see the constants
    above)."""
    if repeated or any(f.fmt == "parquet" for f in files):
        return UNITS_PER_LANE
    return EPOCH_UNITS_PER_LANE


_KEPT_ORDERS = 64
"""Unit orders a work source keeps (one per dataset and epoch in use)."""


class StaticMixtureWorkSource:
    """Datasets, their target mixture, and the seeded order in which lanes read them.

    Keyword options (a data recipe's ``[mixture]`` and ``[work]`` keys):

    repeat
        Datasets (or ``True`` for all) that start a new, reshuffled epoch when they run out.
    on_exhausted
        ``"stop"`` ends a lane when a dataset that is not repeated runs out; ``"drain"`` goes
        on with the others.
    shuffle_units
        Visit work units in a seeded order (else in file order).
    shuffle_rows
        Read the rows of each unit in a seeded order (else in file order).
    unit_bytes
        Target bytes of a JSONL work unit (byte ranges split at line ends).
    arrow_unit_rows
        Rows of an Arrow work unit.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        mixture: MixtureSpec | MixtureSchedule | None = None,
        seed: int = 0,
        token_estimation: TokenEstimation | None = None,
        *,
        repeat: bool | Collection[str] = False,
        on_exhausted: str = "stop",
        shuffle_units: bool = True,
        shuffle_rows: bool = True,
        unit_bytes: int = 8 << 20,
        arrow_unit_rows: int = 4096,
    ):
        datasets = list(datasets)
        if not datasets:
            raise ConfigError("StaticMixtureWorkSource needs at least one dataset")
        for ds in datasets:
            if not isinstance(ds, Dataset):
                raise ConfigError(f"StaticMixtureWorkSource: {ds!r} is not a zephon Dataset "
                                  "(use Dataset.from_path)")
        names = [ds.name for ds in datasets]
        if mixture is None:
            mixture = MixtureSpec({n: 1.0 for n in names})
        problems = self.option_problems(names, mixture, seed, repeat=repeat,
                                        on_exhausted=on_exhausted, unit_bytes=unit_bytes,
                                        arrow_unit_rows=arrow_unit_rows)
        if isinstance(mixture, MixtureSchedule) and not mixture.static and \
                token_estimation is None:
            problems.append("mixture stages end at token counts, so they need mixing by "
                            "tokens (token_estimation=TokenEstimation(); a recipe's [mixture] "
                            "by = \"tokens\")")
        if problems:
            raise ConfigError(f"{type(self).__name__}: " + "; ".join(problems))
        schedule = mixture if isinstance(mixture, MixtureSchedule) else \
            MixtureSchedule([Stage(mixture.as_dict())])
        most = {n: max(stage["weights"].get(n, 0.0) for stage in schedule.describe())
                for n in names}
        repeated = (set(names) if repeat else set()) if isinstance(repeat, bool) else set(repeat)
        active = [ds for ds in datasets if most[ds.name] > 0]
        self.datasets: list[Dataset] = active
        self.unused = [ds.name for ds in datasets if most[ds.name] <= 0]
        """Datasets of weight 0 in every stage: never read, listed in reports with a target
        of 0."""
        self.schedule = schedule
        """Target shares over the job's tokens (one stage: a static mixture)."""
        first = dict(zip(schedule.names, schedule.shares_at(0), strict=True))
        self.weights = np.array([first.get(ds.name, 0.0) for ds in active], dtype=np.float64)
        """The shares of the first stage, by dataset (all of them, for a static mixture)."""
        self.mixture = mixture
        self.seed = seed
        self.token_estimation = token_estimation
        self.repeated = [ds.name in repeated for ds in active]
        self.on_exhausted = on_exhausted
        self.shuffle_units = shuffle_units
        self.shuffle_rows = shuffle_rows
        self.hints = PlanHints(unit_bytes=unit_bytes, arrow_unit_rows=arrow_unit_rows)
        self._plans: dict[int, list[UnitTable]] = {}
        self._work: dict[int, list[PlannedDataset]] = {}
        self._orders: dict[Any, Any] = {}

    @staticmethod
    def option_problems(names: Sequence[str], mixture: MixtureSpec, seed: int, *,
                        repeat: bool | Collection[str] = False, on_exhausted: str = "stop",
                        unit_bytes: int = 8 << 20, arrow_unit_rows: int = 4096) -> list[str]:
        """What is wrong with these options for datasets named ``names``, one message each;
        the datasets themselves are not needed (a recipe checks its options before listing
        files)."""
        problems = []
        duplicates = sorted({n for n in names if list(names).count(n) > 1})
        if duplicates:
            problems.append(f"dataset names must be unique, repeated: {duplicates}")
        if not isinstance(mixture, (MixtureSpec, MixtureSchedule)):
            return [*problems, "mixture must be a MixtureSpec or a MixtureSchedule"]
        weights = mixture.as_dict() if isinstance(mixture, MixtureSpec) else \
            dict.fromkeys(mixture.names, 1.0)
        unknown = sorted(set(weights) - set(names))
        missing = sorted(set(names) - set(weights))
        if unknown or missing:
            problems.append(
                "mixture and datasets disagree"
                + (f"; mixture names unknown datasets {unknown}" if unknown else "")
                + (f"; datasets without a weight {missing}" if missing else "")
                + f" (datasets: {list(names)})")
        if on_exhausted not in EXHAUSTION:
            problems.append(f"on_exhausted={on_exhausted!r} is not one of {EXHAUSTION}")
        if not isinstance(repeat, bool):
            bad = sorted(set(repeat) - set(names))
            if bad:
                problems.append(f"repeat names unknown datasets {bad} (datasets: "
                                f"{sorted(set(names))})")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 64:
            problems.append(f"seed must be an integer in [0, 2**64), got {seed!r}")
        for name, value in (("unit_bytes", unit_bytes), ("arrow_unit_rows", arrow_unit_rows)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 62:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        return problems
    def bound(self, io_options: StoreOptions) -> StaticMixtureWorkSource:
        """This work source with its datasets bound to ``io_options`` (see
        :meth:`zephon.io.Dataset.bound`); the source itself is left unchanged, and returned
        when no dataset needs the options (local data), with the plans it has made."""
        datasets = [ds.bound(io_options) for ds in self.datasets]
        if all(new is old for new, old in zip(datasets, self.datasets, strict=True)):
            return self  # local data needs no options: its plans stay valid
        return self._with_datasets(datasets)

    def _with_datasets(self, datasets: list[Dataset]) -> StaticMixtureWorkSource:
        """A copy of this source over ``datasets`` (the same names), planned afresh."""
        clone = copy.copy(self)
        clone.datasets = datasets
        clone._plans, clone._work, clone._orders = {}, {}, {}
        return clone

    def at_checkpoint_commits(self, saved: dict[str, Any]) -> StaticMixtureWorkSource | None:
        """This source with each Hub dataset whose branch moved since ``saved`` (the
        fingerprint of a loader state) pinned to the commit the state was written at; None
        when no branch moved."""
        datasets, moved = list(self.datasets), False
        for i, dataset, old, new in self._moved(saved):
            log.warning("zephon: %s (dataset %r) is at commit %s now; the checkpoint was "
                        "written at %s, so the run resumes on that commit", new["path"],
                        dataset.name, new["commit"], old["commit"])
            datasets[i] = dataset.pinned(old["commit"], old.get("source"))
            moved = True
        return self._with_datasets(datasets) if moved else None

    def fingerprint_at_checkpoint_commits(self, saved: dict[str, Any]) -> dict[str, Any]:
        """:meth:`fingerprint` as it would be after :meth:`at_checkpoint_commits`, without
        pinning anything (for a preflight)."""
        out = self.fingerprint()
        for _, dataset, old, _ in self._moved(saved):
            out["datasets"][dataset.name] = old
        return out

    def _moved(self, saved: dict[str, Any]) -> list[tuple[int, Dataset, dict, dict]]:
        """(index, dataset, saved identity, identity now) of each Hub dataset whose commit
        differs from ``saved``'s at the same path."""
        before = saved.get("work_source", {}).get("datasets", {})
        out = []
        for i, dataset in enumerate(self.datasets):
            old, new = before.get(dataset.name), dataset.fingerprint()
            if (isinstance(old, dict) and isinstance(new, dict) and "commit" in old
                    and old.get("path") == new.get("path") and old["commit"] != new["commit"]
                    and hasattr(dataset, "pinned")):
                out.append((i, dataset, old, new))
        return out

    @property
    def by_tokens(self) -> bool:
        return self.token_estimation is not None

    def names(self) -> list[str]:
        return [ds.name for ds in self.datasets]

    def work(self, lanes: int) -> list[PlannedDataset]:
        """Each dataset planned for ``lanes`` lanes, as the engine reads it (see
        :mod:`zephon.work.protocol`)."""
        if lanes not in self._work:
            self.plan(lanes)
            self._work[lanes] = [PlannedDataset(self, i, lanes)
                                 for i in range(len(self.datasets))]
        return self._work[lanes]

    # -- planning --------------------------------------------------------------------------
    def plan(self, lanes: int) -> list[UnitTable]:
        """Units of every dataset for ``lanes`` lanes (computed once per lane count, and once
        per job for datasets whose listing is shared: one rank plans, the others receive its
        units, see :func:`zephon.distributed.once_per_job`)."""
        if lanes not in self._plans:
            plans = []
            for index, ds in enumerate(self.datasets):
                units = _planned_units(ds, self.hints, units_per_lane(
                    self.repeated[index], ds.files()) * lanes)
                if not units:
                    raise ConfigError(f"dataset {ds.name!r} ({ds.path}) holds no rows")
                if len(units) < lanes and not self.repeated[index]:
                    raise ConfigError(
                        f"dataset {ds.name!r} splits into only {len(units)} work unit(s) for "
                        f"{lanes} lanes, so some lanes would read none of it. Use fewer lanes, "
                        "more or uncompressed files, or repeat the dataset.")
                plans.append(units)
            self._plans[lanes] = plans
        return self._plans[lanes]

    def sampling_units(self, dataset: int, lanes: int) -> UnitTable:
        """A dataset's units cut as a repeated dataset's are (:data:`UNITS_PER_LANE`), for
        estimates: the finer units of a dataset read once hold too few rows each to sample
        its rows and bytes from (their edges would dominate)."""
        if self.repeated[dataset]:
            return self.plan(lanes)[dataset]
        return _planned_units(self.datasets[dataset], self.hints, UNITS_PER_LANE * lanes)

    def unit_at(self, dataset: int, lane: int, k: int, lanes: int
                ) -> tuple[int, int, tuple[int, UnitSpec]] | None:
        """The ``k``-th unit lane ``lane`` reads from ``dataset``: (epoch, index, unit)."""
        units = self.plan(lanes)[dataset]
        if not self.repeated[dataset]:
            dealt = self._dealt(dataset, lanes)[lane]
            if k >= len(dealt):
                return None
            return 0, int(dealt[k]), units[int(dealt[k])]
        position = lane + k * lanes
        epoch, index = divmod(position, len(units))
        order = self._unit_order(dataset, epoch, len(units))
        return epoch, int(order[index]), units[int(order[index])]

    def units_of_lane(self, dataset: int, lane: int, lanes: int) -> int | None:
        """How many units lane ``lane`` reads of ``dataset`` (None: endless, it repeats)."""
        return None if self.repeated[dataset] else len(self._dealt(dataset, lanes)[lane])

    def _dealt(self, dataset: int, lanes: int) -> list[np.ndarray]:
        """A dataset that is read once, dealt to the lanes balanced by size, so that the
        lanes end together and the run leaves little of its epoch unread. The units, from the
        largest to the smallest (ties in the seeded order), are dealt in passes of one unit a
        lane, each pass going to the lanes from the least loaded to the most (ties to the
        lowest lane): equal units go round-robin, and a lane that got a larger unit gets a
        smaller one next. Each lane then reads its units in the seeded order. Sizes are the
        units' bytes (rows at their file's bytes a row where units count rows). One pass of
        array work a lane's unit count; a function of the lane count and the seed only, so
        the same at every data-parallel size."""
        key = ("dealt", dataset, lanes)
        dealt = self._orders.get(key)
        if dealt is None:
            units = self.plan(lanes)[dataset]
            order = self._unit_order(dataset, 0, len(units))
            rank = np.empty(len(units), dtype=np.int64)
            rank[order] = np.arange(len(units))
            sizes = unit_sizes(units, self.datasets[dataset].files())
            largest = np.lexsort((rank, -sizes))
            owner = np.empty(len(units), dtype=np.int64)
            loads = np.zeros(lanes)
            seats = np.arange(lanes)
            for start in range(0, len(units), lanes):
                batch = largest[start:start + lanes]
                lightest = np.lexsort((seats, loads))[:len(batch)]
                owner[batch] = lightest
                loads[lightest] += sizes[batch]
            by_rank = order[np.argsort(owner[order], kind="stable")]
            counts = np.bincount(owner, minlength=lanes)
            dealt = np.split(by_rank, np.cumsum(counts)[:-1])
            self._keep(key, dealt)
        return dealt

    def _keep(self, key: Any, value: Any) -> None:
        if len(self._orders) >= _KEPT_ORDERS:
            self._orders.pop(next(iter(self._orders)), None)
        self._orders[key] = value

    def lane_units(self, dataset: int, lane: int, lanes: int) -> list[int]:
        """The indices of every unit of a repeated ``dataset`` that lane ``lane`` may ever
        read: all of them when units are shuffled (each epoch's permutation can put any unit
        at any of the lane's positions), else those at the lane's positions
        ``lane + k * lanes`` modulo the unit count ``n``, i.e. every ``gcd(lanes, n)``-th
        unit from ``lane % gcd(lanes, n)``."""
        n = len(self.plan(lanes)[dataset])
        if self.shuffle_units:
            return list(range(n))
        step = math.gcd(lanes, n)
        return list(range(lane % step, n, step))

    def _unit_order(self, dataset: int, epoch: int, n: int) -> np.ndarray:
        """The order of a dataset's ``n`` units in ``epoch``; the last 64 are kept on the
        source itself (a cache on the method would keep 64 sources alive after their
        pipelines are dropped)."""
        key = (dataset, epoch, n)
        order = self._orders.get(key)
        if order is None:
            order = np.arange(n) if not self.shuffle_units else \
                np.random.default_rng([self.seed, dataset, epoch, 0x11]).permutation(n)
            self._keep(key, order)
        return order

    def row_order(self, dataset: int, epoch: int, unit: int, n: int) -> np.ndarray:
        if not self.shuffle_rows:
            return np.arange(n)
        return np.random.default_rng([self.seed, dataset, epoch, unit, 0x22]).permutation(n)

    # -- identity --------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        # The mixture is not here: a resume may change its future, and each lane checks
        # the past it has trained (the lane state keeps the schedule it ran under).
        return {
            "datasets": {ds.name: ds.fingerprint() for ds in self.datasets},
            "mix_by": "tokens" if self.by_tokens else "documents",
            "seed": self.seed,
            "repeat": [ds.name for ds, r in zip(self.datasets, self.repeated, strict=True) if r],
            "on_exhausted": self.on_exhausted,
            "shuffle": [self.shuffle_units, self.shuffle_rows],
            "units": [self.hints.unit_bytes, self.hints.arrow_unit_rows],
        }


def _planned_units(dataset: Dataset, hints: PlanHints, min_units: int) -> UnitTable:
    """``dataset``'s units as a table; planned once per job where its listing is shared.
    The key holds the listing's fingerprint, so a dataset listed differently (another
    version of the files) is planned apart."""
    saved = dataset.saved_units((hints.unit_bytes, hints.arrow_unit_rows, min_units))
    if saved is not None:
        return saved
    if not dataset.job_shared:
        return UnitTable.from_units(dataset.plan(hints, min_units))
    from zephon.distributed import once_per_job

    key = json.dumps(["plan", 1, type(dataset).__name__, dataset.path, dataset.fmt,
                      dataset.documents, dataset.fingerprint(), hints.unit_bytes,
                      hints.arrow_unit_rows, min_units])
    return UnitTable.from_bytes(once_per_job(
        key, lambda: UnitTable.from_units(dataset.plan(hints, min_units)).to_bytes()))


class ScheduledMixtureWorkSource(StaticMixtureWorkSource):
    """A mixture whose target shares change as the job goes on: the stages of a
    :class:`~zephon.work.schedule.MixtureSchedule`, mixed by tokens (the stages end at token
    counts). Stage boundaries are job-wide, so the global microbatches are the same at every
    data-parallel size dividing the lanes, and a resume may change the stages the run has not
    reached (see :mod:`zephon.work.schedule`). Options are those of
    :class:`StaticMixtureWorkSource`."""

    def __init__(self, datasets: Sequence[Dataset], schedule: MixtureSchedule, seed: int = 0,
                 token_estimation: TokenEstimation | None = None, **options: Any):
        if not isinstance(schedule, MixtureSchedule):
            raise ConfigError("ScheduledMixtureWorkSource needs a MixtureSchedule, got "
                              f"{type(schedule).__name__}")
        super().__init__(datasets, schedule, seed, token_estimation or TokenEstimation(),
                         **options)


def unit_sizes(units: UnitTable, files: Sequence[Any]) -> np.ndarray:
    """Each unit's size in bytes, estimated where it counts rows: its rows at its file's
    bytes a row (the file's size over the rows of its units)."""
    file_sizes = np.array([f.size for f in files], dtype=np.float64)
    spans = (units.stop - units.start).astype(np.float64)
    kinds = units.kind
    sizes = spans.copy()
    whole = kinds == KINDS.index("file")
    sizes[whole] = file_sizes[units.file[whole]]
    counted = np.isin(kinds, [KINDS.index("row_group"), KINDS.index("rows")])
    if counted.any():
        rows = np.bincount(units.file[counted], weights=spans[counted],
                           minlength=len(files))
        per_row = np.divide(file_sizes, rows, out=np.ones_like(file_sizes), where=rows > 0)
        sizes[counted] = spans[counted] * per_row[units.file[counted]]
    return sizes
