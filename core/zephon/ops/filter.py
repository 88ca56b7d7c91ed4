"""``filter``: keep only the documents a user function accepts.

The function receives a document as a dict (as for :mod:`zephon.ops.map`) and returns a truth
value. Rejected documents are counted per dataset in the pipeline report under
``filtered:<function name>`` (and in ``DatasetReport.filtered``). The function must be a pure
function of the document; its name is part of the pipeline fingerprint.

Mixing counts only documents that pass, so a filter that rejects most of one dataset makes
that dataset read further to keep its share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.ops.base import Dropped, Outcome
from zephon.ops.functions import FunctionOperator, FunctionSpec
from zephon.records import Doc
from zephon.report import FILTERED_PREFIX


class FilterOperator(FunctionOperator):
    def __init__(self, spec: FilterSpec):
        super().__init__(spec)
        self._dropped = Dropped(f"{FILTERED_PREFIX}{self.name}")

    def outcome(self, doc: Doc, result: Any, label: str) -> Outcome:
        return [doc] if result else self._dropped


@dataclass(frozen=True)
class FilterSpec(FunctionSpec):
    """Options of ``filter``: ``fn(document dict) -> bool``, the document kept when true; the
    report counts the others under ``filtered:<function>``."""

    op_name: ClassVar[str] = "filter"
    title: ClassVar[str] = "filter"
    operator: ClassVar[type[FunctionOperator]] = FilterOperator

