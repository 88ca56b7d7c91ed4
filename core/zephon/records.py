"""What flows between operators: documents before packing, records after it.

A :class:`Doc` is one document (or one piece of a long document) on its way from a dataset to
the packer: raw column values in ``fields`` until a tokenizing operator turns them into
``tokens`` (int32) and, for chat data, a per-token ``train_mask``. A :class:`Record` is a row
ready for batching: a ``payload`` (numpy arrays for token data, raw column values otherwise)
and a ``meta`` mapping. Packed rows list every document they contain as :class:`DocSpan`
entries, so provenance survives packing: a test (or a user) can account for every token of
every document.

Both convert to and from plain data (dicts, lists, numbers, strings, numpy arrays) for
checkpoints, which never depend on the names or layout of Zephon's classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np


class DocSpan(NamedTuple):
    """A contiguous piece of one document inside a packed row.

    ``doc_start`` is the offset of the piece inside the tokenized document, ``row_start`` its
    offset inside the row, ``length`` its number of tokens. A named tuple, not a dataclass:
    packing makes two or three a row, and a frozen dataclass takes several times as long to
    build (measured: docs/measurements.md).
    """

    doc_id: str
    dataset: str
    doc_start: int
    row_start: int
    length: int


@dataclass(slots=True)
class Doc:
    """A document (or a piece of one) between its dataset and the packer.

    ``doc_start`` is the offset of this piece inside the whole tokenized document (0 for the
    first piece). ``fields`` holds the row's columns before tokenization and is dropped by the
    tokenizing operator.
    """

    tokens: np.ndarray | None
    doc_id: str
    dataset: str
    doc_start: int = 0
    train_mask: np.ndarray | None = None
    fields: dict[str, Any] | None = None

    def to_plain(self) -> list[Any]:
        return [self.tokens, self.doc_id, self.dataset, self.doc_start, self.train_mask,
                self.fields]

    @classmethod
    def from_plain(cls, plain: list[Any]) -> Doc:
        return cls(*plain)


@dataclass(slots=True)
class Record:
    """One row moving through a pipeline.

    ``meta`` always has ``id`` and, once tokenized, ``dataset``. Packed rows add ``lane``,
    ``documents`` (a tuple of :class:`DocSpan`) and ``padding`` (number of pad tokens at the
    end of the row).
    """

    payload: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.meta["id"]

    def to_plain(self) -> dict[str, Any]:
        meta = dict(self.meta)
        if "documents" in meta:
            meta["documents"] = [[s.doc_id, s.dataset, s.doc_start, s.row_start, s.length]
                                 for s in meta["documents"]]
        return {"payload": dict(self.payload), "meta": meta}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Record:
        meta = dict(plain["meta"])
        if "documents" in meta:
            meta["documents"] = tuple(DocSpan(*s) for s in meta["documents"])
        return cls(dict(plain["payload"]), meta)


def doc_as_record(doc: Doc, lane: int) -> Record:
    """An unpacked document as a row of its own (pipelines without a packing operator)."""
    if doc.tokens is None:
        return Record(dict(doc.fields or {}), {"id": doc.doc_id, "dataset": doc.dataset,
                                               "lane": lane})
    payload = {"input_ids": doc.tokens}
    if doc.train_mask is not None:
        payload["train_mask"] = doc.train_mask
    span = DocSpan(doc.doc_id, doc.dataset, doc.doc_start, 0, len(doc.tokens))
    meta = {"id": f"{doc.doc_id}@{doc.doc_start}", "dataset": doc.dataset, "lane": lane,
            "documents": (span,), "padding": 0}
    return Record(payload, meta)


def record_counts(record: Record) -> tuple[int, int]:
    """(documents starting in the row, tokens of documents in the row), for drop accounting."""
    spans = record.meta.get("documents")
    if spans is None:  # an unpacked, untokenized row is one document
        return 1, 0
    return sum(1 for s in spans if s.doc_start == 0), sum(s.length for s in spans)
