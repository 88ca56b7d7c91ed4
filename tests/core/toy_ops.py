"""A toy operator written the way a user would: one module, nothing else in Zephon touched.

``drop_short`` drops tokenized documents shorter than ``min_tokens`` (counted in the report
as ``too_short``); ``shout`` upper-cases a text field before tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from zephon.ops.base import BuildContext, DocumentOperator, Dropped, OperatorSpec, Outcome
from zephon.records import Doc


@dataclass(frozen=True)
class DropShortSpec(OperatorSpec):
    """Drop documents with fewer than ``min_tokens`` tokens."""

    op_name: ClassVar[str] = "drop_short"
    title: ClassVar[str] = "drop_short"
    stage: ClassVar[str] = "document"
    needs_tokens: ClassVar[bool] = True

    min_tokens: int = 8
    """Documents shorter than this are dropped."""

    def build(self, context: BuildContext) -> DropShort:
        return DropShort(self)


class DropShort(DocumentOperator):
    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        limit = self.spec.min_tokens
        return [[d] if len(d.tokens) >= limit else Dropped("too_short") for d in docs]


@dataclass(frozen=True)
class ShoutSpec(OperatorSpec):
    """Upper-case the text in ``field``."""

    op_name: ClassVar[str] = "shout"
    title: ClassVar[str] = "shout"
    stage: ClassVar[str] = "document"

    field: str = "text"
    """The column to upper-case."""

    def build(self, context: BuildContext) -> Shout:
        return Shout(self)


class Shout(DocumentOperator):
    def __init__(self, spec: ShoutSpec):
        super().__init__(spec)
        self.columns = [spec.field]

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        name = self.spec.field
        return [[Doc(None, d.doc_id, d.dataset, fields={**d.fields, name: d.fields[name].upper()})]
                for d in docs]


# Functions for map and filter, named by import path in recipes.
def shout_text(doc: dict) -> dict:
    return {**doc, "text": doc["text"].upper()}


def keep_even_length(doc: dict) -> bool:
    return len(doc["text"]) % 2 == 0


def keep_odd_length(doc: dict) -> bool:
    return len(doc["text"]) % 2 == 1


def first_ten_tokens(doc: dict) -> dict:
    return {"input_ids": doc["input_ids"][:10]}


def not_a_dict(doc: dict) -> list:
    return [doc]
