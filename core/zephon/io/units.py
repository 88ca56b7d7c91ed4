"""Units: where a unit of work lies inside its file, and how files are cut into them (the
part of :mod:`zephon.io.formats` that format plug-ins share)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UnitSpec:
    """Where a unit lies inside its file. Meaning of ``start``/``stop`` depends on ``kind``:
    ``row_group`` (rows inside Parquet row group ``group``), ``rows`` (rows of an Arrow file,
    documents of a Megatron indexed dataset), ``bytes`` (byte range of a JSONL file) or
    ``file`` (the whole file)."""

    kind: str
    group: int
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class PlanHints:
    unit_bytes: int
    """Target size of a JSONL byte-range unit."""
    arrow_unit_rows: int
    """Target rows of an Arrow unit (documents of an indexed-dataset unit)."""


def row_units(start: int, stop: int, unit_rows: int, min_units: int) -> list[UnitSpec]:
    """Rows ``start..stop`` in units of at most ``unit_rows`` rows, at least ``min_units``
    of them while each holds a row."""
    rows = stop - start
    if rows <= 0:
        return []
    per_unit = min(unit_rows, max(1, math.ceil(rows / max(min_units, 1))))
    return [UnitSpec("rows", 0, s, min(s + per_unit, stop)) for s in range(start, stop,
                                                                           per_unit)]
