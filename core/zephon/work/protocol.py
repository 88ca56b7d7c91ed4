"""The work-source protocol: everything the engine asks of what it reads.

The engine (:mod:`zephon.engine`) and the loader runtime see a work source only through
these two protocols, so a work source needs no files, tokenizer or object store: a test can
drive the engine with units held in memory (``tests/core/test_work_protocol.py``).

A **work source** is a fixed list of datasets, a mixture schedule over them, a seed and a
fingerprint. Planned for a lane count ``L`` (:meth:`WorkSource.work`), it gives one
:class:`DatasetWork` a dataset. A **dataset's work** is a sequence of *units* each lane reads
in order: lane ``l``'s ``k``-th unit is :meth:`DatasetWork.unit_at` ``(l, k, L)``, a
:class:`LaneUnit` naming the unit, its epoch and (where known before reading) its rows;
:meth:`DatasetWork.read` returns the unit's rows and :meth:`DatasetWork.row_order` the order
a lane reads them in.

What the engine relies on, and each implementation must keep:

- **Purity.** ``unit_at``, ``units_of_lane``, ``lane_units`` and ``row_order`` are functions
  of their arguments, the seed and the data alone: never of the rank, the data-parallel
  size, timing or what was read before. This is what makes lanes (and so the global
  microbatches) the same at every data-parallel size, and a resume exact: a lane's state is
  only ``(k, row, piece)`` positions into these sequences.
- **Stable rows.** :meth:`DatasetWork.read` of one unit returns the same rows and keys every
  time it is called (a resume reads a unit again from a position inside it).
- **Identity.** :meth:`WorkSource.fingerprint` changes whenever the documents a lane would
  read change (files, seed, options); :meth:`DatasetWork.digest` covers the planned units.
  Both are plain data (they are sealed into loader states and compared across ranks).
- **Ends.** A dataset that repeats never runs out of units (``unit_at`` never returns None,
  ``units_of_lane`` is None); one read once gives lane ``l`` exactly ``units_of_lane(l, L)``.

The shipped implementation is :class:`~zephon.work.static_mixture.StaticMixtureWorkSource`
(and its scheduled sibling) over files, object stores and the Hub.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from zephon.work.schedule import MixtureSchedule


class LaneUnit(NamedTuple):
    """One unit as a lane reads it."""

    epoch: int
    """The dataset's epoch this reading of the unit belongs to (0 for a dataset read once);
    a repeated dataset's documents get an epoch suffix in their ids."""
    index: int
    """The unit's index among the dataset's units (what :meth:`DatasetWork.read` takes)."""
    container: int
    """Which file (or other container) of the dataset holds the unit: it prefixes the ids
    of the unit's documents."""
    rows: int | None
    """The unit's row count where known before reading it (None: counted when read); a
    restored position past it is refused before any read."""


class UnitRows(NamedTuple):
    """What reading one unit gives."""

    columns: dict[str, list[Any]]
    """Column name to values, one value a row (only the columns asked for, where the source
    can project)."""
    keys: list[int]
    """Each row's key, unique within its container: document ids are ``name:container:key``.
    """
    label: Callable[[int], Any]
    """A row's label for messages, from its key (``str(label(key))`` names the row)."""
    container: int
    """Which file (or other container) of the dataset holds the unit (as
    :attr:`LaneUnit.container`)."""


@runtime_checkable
class DatasetWork(Protocol):
    """One dataset's units for one lane count; see the module docstring."""

    name: str
    """The dataset's name (unique within its work source)."""
    repeated: bool
    """Whether the dataset starts a new epoch when it runs out (else a lane's units end)."""

    def unit_count(self) -> int:
        """How many units the dataset is planned into."""
        ...

    def unit_at(self, lane: int, k: int) -> LaneUnit | None:
        """The ``k``-th unit lane ``lane`` reads (None: the lane has read all of its units of a
        dataset read once)."""
        ...

    def units_of_lane(self, lane: int) -> int | None:
        """How many units lane ``lane`` reads (None: endless, the dataset repeats)."""
        ...

    def lane_units(self, lane: int) -> list[int]:
        """Every unit index lane ``lane`` may ever be given (to tell whether a repeated
        dataset can yield documents at all)."""
        ...

    def row_order(self, unit: LaneUnit, n: int) -> np.ndarray:
        """The order in which a lane reads the ``n`` rows of ``unit``: a permutation of
        ``range(n)``."""
        ...

    def read(self, index: int, columns: Sequence[str] | None) -> UnitRows:
        """The rows of unit ``index``, with ``columns`` (None: all)."""
        ...

    def fetch_ahead(self, units: Sequence[LaneUnit]) -> None:
        """A hint that ``units`` come next: a remote source may start fetching them. Must not
        change what :meth:`read` returns."""
        ...

    def digest(self) -> str:
        """A digest of the planned units (in loader states and the ranks' check)."""
        ...

    def skipped_files(self) -> list[Any]:
        """What the dataset left out when listing (for reports; may be empty)."""
        ...


@runtime_checkable
class WorkSource(Protocol):
    """Datasets, their mixture and their seeded order; see the module docstring."""

    seed: int
    """Seeds everything random in the lanes (operators get it in their build context)."""
    schedule: MixtureSchedule
    """Target shares over the job's tokens or documents (one stage: a static mixture)."""
    on_exhausted: str
    """``"stop"`` ends a lane when a dataset read once runs out; ``"drain"`` goes on with the
    others."""
    unused: list[str]
    """Datasets never read (weight 0 in every stage), reported with a target of 0."""

    @property
    def by_tokens(self) -> bool:
        """Whether the mixture counts tokens (else documents)."""
        ...

    def names(self) -> list[str]:
        """The names of the datasets read, in the order :meth:`work` gives them."""
        ...

    def work(self, lanes: int) -> Sequence[DatasetWork]:
        """Each dataset's units planned for ``lanes`` lanes (planned once a lane count)."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """Plain data that changes whenever what a lane reads changes (the mixture excepted:
        each lane checks the schedule it trained under itself)."""
        ...

    def bound(self, io_options: Any) -> WorkSource:
        """This source with its storage bound to ``io_options`` (itself where it has none)."""
        ...


_NEEDED = ("seed", "schedule", "on_exhausted", "unused", "by_tokens", "names", "work",
           "fingerprint", "bound")


def work_source_problem(source: Any) -> str | None:
    """Why ``source`` is not a work source (the members it lacks), or None."""
    missing = [name for name in _NEEDED if not hasattr(source, name)]
    if missing:
        return (f"{type(source).__name__} is not a work source: it lacks {missing} (see "
                "zephon.work.protocol.WorkSource; StaticMixtureWorkSource is one)")
    if not isinstance(source.schedule, MixtureSchedule):
        return (f"{type(source).__name__}.schedule is a {type(source.schedule).__name__}, "
                "not a zephon.work.MixtureSchedule")
    return None
