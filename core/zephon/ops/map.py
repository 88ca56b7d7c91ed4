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

from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.ops.base import Outcome
from zephon.ops.functions import FunctionOperator, FunctionSpec, doc_from_view
from zephon.records import Doc


class MapOperator(FunctionOperator):
    def outcome(self, doc: Doc, result: Any, label: str) -> Outcome:
        return [doc_from_view(doc, result, self.name, label)]


@dataclass(frozen=True)
class MapSpec(FunctionSpec):
    """Options of ``map``: ``fn(document dict) -> document dict``."""

    op_name: ClassVar[str] = "map"
    title: ClassVar[str] = "map"
    operator: ClassVar[type[FunctionOperator]] = MapOperator

