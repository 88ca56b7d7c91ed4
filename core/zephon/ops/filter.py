"""``filter``: keep only the documents a user function accepts.

The function receives a document as a dict (as for :mod:`zephon.ops.map`) and returns a truth
value. Rejected documents are counted per dataset in the pipeline report under
``filtered:<function name>`` (and in ``DatasetReport.filtered``). The function must be a pure
function of the document; its name is part of the pipeline fingerprint.

Mixing counts only documents that pass, so a filter that rejects most of one dataset makes
that dataset read further to keep its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from zephon.ops.base import BuildContext, Dropped, Outcome
from zephon.ops.functions import FunctionOperator, FunctionSpec, doc_view
from zephon.records import Doc
from zephon.report import FILTERED_PREFIX


@dataclass(frozen=True)
class FilterSpec(FunctionSpec):
    """Options of ``filter``: ``fn(document dict) -> bool`` (keep when true)."""

    op_name: ClassVar[str] = "filter"
    title: ClassVar[str] = "filter"

    def build(self, context: BuildContext) -> FilterOperator:
        return FilterOperator(self)


class FilterOperator(FunctionOperator):
    def __init__(self, spec: FilterSpec):
        super().__init__(spec)
        self._dropped = Dropped(f"{FILTERED_PREFIX}{self.name}")

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        return [[doc] if self.call(doc_view(doc), label) else self._dropped
                for doc, label in zip(docs, where, strict=True)]
