"""The document operators applied to a batch of documents: the one function the lanes'
producer, the document threads and the worker processes all run, so each gives the same
documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon.ops.base import DocumentOperator, Dropped, LazyPieces
from zephon.records import Doc


def transform_documents(ops: Sequence[DocumentOperator], docs: list[Doc], labels: list[str],
                        lazy: bool = False) -> list[tuple[list[Any], list[str]]]:
    """Each row's documents after every document operator, and the drop reasons on the way.

    ``lazy``: the last operator's :class:`LazyPieces` stay lazy (elements of a row's list);
    otherwise, and before later operators, they are made into documents here."""
    rows: list[tuple[list[Any], list[str]]] = [([d], []) for d in docs]
    for index, op in enumerate(ops):
        if index == 0:  # each row is its one document
            owners: Sequence[int] = range(len(docs))
            inputs, where = docs, labels
        else:
            owners = [i for i, (outputs, _) in enumerate(rows) for _ in outputs]
            inputs = [d for outputs, _ in rows for d in outputs]
            where = [labels[i] for i in owners]
        if not inputs:
            break
        outcomes = op.apply(inputs, where)
        keep_lazy = lazy and index == len(ops) - 1
        fresh: list[tuple[list[Any], list[str]]] = [([], drops) for _, drops in rows]
        for i, outcome in zip(owners, outcomes, strict=True):
            if isinstance(outcome, Dropped):
                fresh[i][1].append(outcome.reason)
            elif isinstance(outcome, LazyPieces) and keep_lazy:
                fresh[i][0].append(outcome)
            else:
                fresh[i][0].extend(outcome)
        rows = fresh
    return rows
