"""``tokenize``: text field -> int32 token ids, with BOS/EOS added per document.

Documents are encoded in batches of ``batch_size`` through the Rust backend (see
:mod:`zephon.tokenizer`); the batch size changes speed, never the tokens. A document longer
than ``max_document_tokens`` (counting BOS/EOS) is split into consecutive pieces of at most that
many tokens, each packed as its own document; only the first piece carries BOS and only the
last carries EOS. Empty or null texts produce no document and are counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError, DataError
from zephon.ops.base import (
    BuildContext,
    DocumentOperator,
    DocumentSpec,
    Dropped,
    Outcome,
)
from zephon.records import Doc
from zephon.tokenizer import TextEncoder, resolve_encoder


@dataclass(frozen=True)
class TokenizeSpec(DocumentSpec):
    """The ``tokenize`` operator's options."""

    op_name: ClassVar[str] = "tokenize"
    title: ClassVar[str] = "tokenizer or tokenize"
    makes_tokens: ClassVar[bool] = True

    tokenizer_id: str | None = None
    """A local tokenizer directory or a Hub id (loaded through transformers)."""
    field: str = "text"
    """Column holding the document text."""
    tokenizer: Any = dataclasses.field(default=None, metadata={"recipe": False,
                                                              "fingerprint": False})
    """A tokenizer object instead of ``tokenizer_id`` (Python only)."""
    add_bos: bool | None = None
    """Prefix each document with BOS. None: when the tokenizer defines a BOS token."""
    add_eos: bool | None = None
    """Suffix each document with EOS. None: when the tokenizer defines an EOS token."""
    max_document_tokens: int | None = None
    """Split longer documents into pieces of at most this many tokens (None: never split)."""
    batch_size: int = dataclasses.field(default=256, metadata={"fingerprint": False})
    """Documents per backend call; affects speed only, never the tokens."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.field or not isinstance(self.field, str):
            raise ConfigError(f"tokenize: field must be a column name, got {self.field!r}")
        if (self.tokenizer_id is None) == (self.tokenizer is None):
            raise ConfigError("tokenize: give exactly one of tokenizer_id=... or tokenizer=...")
        if self.max_document_tokens is not None and self.max_document_tokens < 2:
            raise ConfigError(f"tokenize: max_document_tokens must be >= 2, "
                              f"got {self.max_document_tokens}")
        if self.batch_size <= 0:
            raise ConfigError(f"tokenize: batch_size must be positive, got {self.batch_size}")

    def build(self, context: BuildContext) -> DocumentTokenizer:
        tokenizer = DocumentTokenizer(self)
        context.encoder = tokenizer.encoder
        context.special = tokenizer.encoder.special
        return tokenizer


class DocumentTokenizer(DocumentOperator):
    """Runtime side of :class:`TokenizeSpec`."""

    def __init__(self, spec: TokenizeSpec):
        super().__init__(spec)
        self.spec: TokenizeSpec = spec
        self.columns = [spec.field]
        self.batch_size = spec.batch_size
        self.encoder: TextEncoder = resolve_encoder(spec.tokenizer_id, spec.tokenizer)
        special = self.encoder.special
        self.bos = _special(spec.add_bos, special.bos, "add_bos", "BOS")
        self.eos = _special(spec.add_eos, special.eos, "add_eos", "EOS")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "op": self.spec.op_name,
            "datasets": self.spec.datasets,
            "tokenizer": self.encoder.digest,
            "field": self.spec.field,
            "bos": self.bos,
            "eos": self.eos,
            "max_document_tokens": self.spec.max_document_tokens,
        }

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        """Documents with text in ``field`` -> their token pieces (offsets in ``doc_start``);
        an empty or null text is dropped as ``empty``."""
        name = self.spec.field
        texts = []
        for doc, label in zip(docs, where, strict=True):
            fields = doc.fields or {}
            if name not in fields:
                raise DataError(f"{label}: missing field {name!r} (has {sorted(fields)})")
            value = fields[name]
            if value is not None and not isinstance(value, str):
                raise DataError(f"{label}: field {name!r} is {type(value).__name__}, "
                                "expected text")
            texts.append(value or "")
        out: list[Outcome] = []
        for doc, pieces in zip(docs, self.encode(texts), strict=True):
            if not pieces:
                out.append(Dropped("empty"))
                continue
            out.append(split_pieces(doc, pieces, None))
        return out

    def encode(self, texts: list[str]) -> list[list[np.ndarray]]:
        """Each text -> its pieces (an empty list for an empty document)."""
        encoded = self.encoder.encode(texts)
        out: list[list[np.ndarray]] = []
        bos = np.array([self.bos], dtype=np.int32) if self.bos is not None else None
        eos = np.array([self.eos], dtype=np.int32) if self.eos is not None else None
        limit = self.spec.max_document_tokens
        for ids in encoded:
            if ids.size == 0:
                out.append([])
                continue
            parts = [p for p in (bos, ids, eos) if p is not None]
            doc = np.concatenate(parts) if len(parts) > 1 else ids
            if limit is None or doc.size <= limit:
                out.append([doc])
            else:
                out.append([doc[i:i + limit] for i in range(0, doc.size, limit)])
        return out


def split_pieces(doc: Doc, pieces: list[np.ndarray], masks: list[np.ndarray] | None
                 ) -> list[Doc]:
    """Tokenized pieces of ``doc`` as documents carrying their offsets; fields are dropped."""
    out, offset = [], doc.doc_start
    for i, piece in enumerate(pieces):
        out.append(Doc(piece, doc.doc_id, doc.dataset, offset,
                       masks[i] if masks is not None else None))
        offset += len(piece)
    return out


def _special(asked: bool | None, token: int | None, option: str, name: str) -> int | None:
    if asked is False:
        return None
    if token is None:
        if asked:
            raise ConfigError(f"tokenize: {option}=True but the tokenizer has no {name} token")
        return None
    return token
