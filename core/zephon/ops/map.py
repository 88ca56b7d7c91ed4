"""``map``: a user function applied to every document before packing.

The function receives a document as a dict (the row's fields before tokenization;
``input_ids`` and, for chat data, ``train_mask`` after it) and returns the new dict. It must be
a pure function of the document (no randomness or state of its own): a resumed lane re-reads
its current unit and applies the function again, so the same input must give the same output.
Its name is part of the pipeline fingerprint (see :mod:`zephon.ops.functions`).

Documents reach the function in the source's read-ahead batches, between tokenizer calls, off
the trainer's thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.ops.base import BuildContext, DocumentOperator, OperatorSpec, Outcome
from zephon.ops.functions import (
    check_function_options,
    doc_from_view,
    doc_view,
    resolve_function,
)
from zephon.records import Doc


@dataclass(frozen=True)
class MapSpec(OperatorSpec):
    """Options of ``map``."""

    op_name: ClassVar[str] = "map"
    title: ClassVar[str] = "map"
    stage: ClassVar[str] = "document"
    once: ClassVar[bool] = False

    fn: Callable[[dict[str, Any]], dict[str, Any]] | str = dataclasses.field(
        metadata={"fingerprint": False})
    """The function, or its import path ``"package.module:function"``."""
    columns: tuple[str, ...] | None = None
    """Columns the function reads before tokenization (None: all); fewer columns read faster."""

    def __post_init__(self) -> None:
        check_function_options(self)

    def build(self, context: BuildContext) -> MapOperator:
        return MapOperator(self)


class MapOperator(DocumentOperator):
    def __init__(self, spec: MapSpec):
        super().__init__(spec)
        self.fn, self.name = resolve_function(spec.fn, spec.op_name)
        self.columns = list(spec.columns) if spec.columns is not None else None

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "fn": self.name}

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        return [[doc_from_view(doc, self.fn(doc_view(doc)), self.name, label)]
                for doc, label in zip(docs, where, strict=True)]
