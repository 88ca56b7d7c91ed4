"""Megatron's indexed datasets (a ``.idx`` index and its ``.bin`` tokens, read through
:mod:`zephon.io.indexed`): one column, each document's token ids; a unit is a range of
documents, and a row's key is its document number."""

from __future__ import annotations

from typing import Any

from zephon.errors import DataError
from zephon.io.formats.arrow_columns import check_columns
from zephon.io.indexed import DocumentColumn, open_indexed
from zephon.io.units import PlanHints, UnitSpec, row_units

SUFFIXES = {".idx": None}
TOKENS_FIELD = "input_ids"
"""The one column a Megatron indexed dataset has: each document's token ids."""


def plan(path: str, compression: str | None, hints: PlanHints, min_units: int,
         rows: tuple[int, int] | None = None) -> list[UnitSpec]:
    """Document ranges of ``hints.arrow_unit_rows`` at most, over ``rows`` (the dataset's
    ``documents=...``) or every document."""
    count = open_indexed(path).documents
    start, stop = rows if rows is not None else (0, count)
    if not 0 <= start <= stop <= count:
        raise DataError(f"{path}: documents {start}..{stop} are outside its "
                        f"{count} documents")
    return row_units(start, stop, hints.arrow_unit_rows, min_units)


def fields(path: str, compression: str | None) -> dict[str, str]:
    """Its one field: each document's token ids."""
    return {TOKENS_FIELD: "list<int>"}


def read(path: str, compression: str | None, unit: UnitSpec, columns: list[str] | None,
         display: str) -> tuple[dict[str, Any], list[int]]:
    """A unit's documents, as a column of token-id arrays read from the mapped ``.bin``."""
    if columns is not None:
        check_columns([TOKENS_FIELD], columns, display)
    column = DocumentColumn(open_indexed(path), unit.start, unit.stop)
    return {TOKENS_FIELD: column}, list(range(unit.start, unit.stop))
