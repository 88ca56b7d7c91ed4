"""User functions for ``map`` and ``filter``: given as callables or as import paths.

A function is named by ``"package.module:function"`` in recipes (``"package.module.function"``
also works) and by its module and qualified name in Python. The name, not the code, is what the
pipeline fingerprint records: renaming a function refuses a resume, editing its body does not
(keep functions that change their output under a new name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.named_objects import import_named, split_name
from zephon.ops.base import BuildContext, DocumentOperator, DocumentSpec, Outcome
from zephon.records import Doc


@dataclass(frozen=True)
class FunctionSpec(DocumentSpec):
    """Options shared by the operators that run a user function on each document."""

    fn: Callable[[dict[str, Any]], Any] | str = dataclasses.field(
        metadata={"fingerprint": False})
    """The function, or its import path ``"package.module:function"``."""
    columns: tuple[str, ...] | None = None
    """Columns the function reads before tokenization (None: all); fewer columns read faster."""
    operator: ClassVar[type[FunctionOperator]]
    """The operator class these options build."""

    def build(self, context: BuildContext) -> FunctionOperator:
        return self.operator(self)

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_function(self.fn, self.op_name)
        if isinstance(self.columns, list):
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.columns is not None and not all(isinstance(c, str) for c in self.columns):
            raise ConfigError(f"{self.op_name}: columns must be column names, "
                              f"got {self.columns!r}")


class FunctionOperator(DocumentOperator):
    """A built :class:`FunctionSpec`: the resolved function and its fingerprint name."""

    def __init__(self, spec: FunctionSpec):
        super().__init__(spec)
        self.fn, self.name = resolve_function(spec.fn, spec.op_name)
        self.columns = list(spec.columns) if spec.columns is not None else None

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "fn": self.name}

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        return [self.outcome(doc, self.call(doc_view(doc), label), label)
                for doc, label in zip(docs, where, strict=True)]

    def outcome(self, doc: Doc, result: Any, label: str) -> Outcome:
        """What ``doc`` becomes, given what the function returned for it."""
        raise NotImplementedError

    def call(self, document: dict[str, Any], label: str) -> Any:
        """The function on one document; what it raises becomes a DataError naming the row
        (``label``: dataset file and row) and the function, the original kept as the cause.
        Zephon's own errors (a ConfigError of a nested pipeline) pass through."""
        try:
            return self.fn(document)
        except ZephonError:
            raise
        except Exception as exc:
            raise DataError(f"{label}: {self.spec.op_name} function {self.name} raised "
                            f"{type(exc).__name__}: {exc}") from exc


def resolve_function(ref: Callable[..., Any] | str, op: str) -> tuple[Callable[..., Any], str]:
    """(the function, its fingerprint name) for a callable or an import path."""
    if callable(ref):
        owner = getattr(ref, "__objclass__", None)  # methods of built-in types
        module = getattr(ref, "__module__", None) or getattr(owner, "__module__", None) or "?"
        qualname = getattr(ref, "__qualname__", None) or type(ref).__qualname__
        return ref, f"{module}:{qualname}"
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"{op}: fn must be a function or 'package.module:function', "
                          f"got {ref!r}")
    module_name, attr = split_name(ref, f"{op}: fn")
    target = import_named(ref, f"{op}: fn")
    if not callable(target):
        raise ConfigError(f"{op}: fn={ref!r} is not callable")
    return target, f"{module_name}:{attr}"


def doc_view(doc: Doc) -> dict[str, Any]:
    """What a user function sees: the row's fields before tokenization; ``input_ids`` (and
    ``train_mask`` for chat data) after it."""
    if doc.tokens is None:
        return dict(doc.fields or {})
    view: dict[str, Any] = {"input_ids": doc.tokens}
    if doc.train_mask is not None:
        view["train_mask"] = doc.train_mask
    return view


def doc_from_view(doc: Doc, view: Any, name: str, where: str) -> Doc:
    """``doc`` with the fields (or tokens) a map function returned."""
    if not isinstance(view, dict):
        raise DataError(f"{where}: map {name} returned {type(view).__name__}, expected a dict")
    if doc.tokens is None:
        return Doc(None, doc.doc_id, doc.dataset, doc.doc_start, None, view)
    if "input_ids" not in view:
        raise DataError(f"{where}: map {name} returned no 'input_ids' for a tokenized document")
    tokens = np.asarray(view["input_ids"])
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise DataError(f"{where}: map {name} returned input_ids of shape {tokens.shape} and "
                        f"dtype {tokens.dtype}, expected a 1-D integer array")
    mask = view.get("train_mask")
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != tokens.shape:
            raise DataError(f"{where}: map {name} returned a train_mask of shape {mask.shape} "
                            f"for input_ids of shape {tokens.shape}")
    return Doc(tokens.astype(np.int32, copy=False), doc.doc_id, doc.dataset, doc.doc_start,
               mask)
