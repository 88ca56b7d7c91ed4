"""``filter``: keep only the documents a user function accepts.

The function receives a document as a dict (as for :mod:`zephon.ops.map`) and returns a truth
value. Rejected documents are counted per dataset in the pipeline report under
``filtered:<function name>`` (and in ``DatasetReport.filtered``). The function must be a pure
function of the document; its name is part of the pipeline fingerprint.

Mixing counts only documents that pass, so a filter that rejects most of one dataset makes
that dataset read further to keep its share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.ops.base import BuildContext, DocumentOperator, Dropped, OperatorSpec, Outcome
from zephon.ops.functions import check_function_options, doc_view, resolve_function
from zephon.records import Doc
from zephon.report import FILTERED_PREFIX


@dataclass(frozen=True)
class FilterSpec(OperatorSpec):
    """Options of ``filter``."""

    op_name: ClassVar[str] = "filter"
    title: ClassVar[str] = "filter"
    stage: ClassVar[str] = "document"
    once: ClassVar[bool] = False

    fn: Callable[[dict[str, Any]], Any] | str = dataclasses.field(
        metadata={"fingerprint": False})
    """The predicate, or its import path ``"package.module:function"``."""
    columns: tuple[str, ...] | None = None
    """Columns the predicate reads before tokenization (None: all)."""

    def __post_init__(self) -> None:
        check_function_options(self)

    def build(self, context: BuildContext) -> FilterOperator:
        return FilterOperator(self)


class FilterOperator(DocumentOperator):
    def __init__(self, spec: FilterSpec):
        super().__init__(spec)
        self.fn, self.name = resolve_function(spec.fn, spec.op_name)
        self.columns = list(spec.columns) if spec.columns is not None else None
        self._dropped = Dropped(f"{FILTERED_PREFIX}{self.name}")

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "fn": self.name}

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        return [[doc] if self.fn(doc_view(doc)) else self._dropped for doc in docs]
