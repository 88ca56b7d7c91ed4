"""Records: the unit that flows between pipeline operators.

A record holds a ``payload`` (numpy arrays for token data, raw column values otherwise) and a
``meta`` mapping. Packed rows list every document they contain as :class:`DocSpan` entries, so
provenance survives packing: a test (or a user) can account for every token of every document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DocSpan:
    """A contiguous piece of one document inside a packed row.

    ``doc_start`` is the offset of the piece inside the tokenized document, ``row_start`` its
    offset inside the row, ``length`` its number of tokens.
    """

    doc_id: str
    dataset: str
    doc_start: int
    row_start: int
    length: int


@dataclass(slots=True)
class Record:
    """One example moving through a pipeline.

    ``meta`` always has ``id`` and, once tokenized, ``dataset``. Packed rows add ``lane``,
    ``documents`` (a tuple of :class:`DocSpan`) and ``padding`` (number of pad tokens at the
    end of the row).
    """

    payload: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.meta["id"]
