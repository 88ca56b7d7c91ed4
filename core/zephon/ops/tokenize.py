"""``tokenize``: text field -> int32 token ids, with BOS/EOS added per document.

Documents are encoded in batches of ``batch_size`` through the Rust backend (see
:mod:`zephon.tokenizer`); the batch size changes speed, never the tokens. A document longer
than ``max_document_tokens`` (counting BOS/EOS) is split into consecutive pieces of at most that
many tokens, each packed as its own document; only the first piece carries BOS and only the
last carries EOS. Empty or null texts produce no document and are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zephon.errors import ConfigError, DataError
from zephon.tokenizer import TextEncoder, resolve_encoder


@dataclass(slots=True)
class Encoded:
    """One input row after tokenization: its document pieces (with per-token train masks for
    chat data), or the reason it produced no document."""

    pieces: list[np.ndarray]
    masks: list[np.ndarray] | None = None
    skipped: str | None = None


class RowEncoder(Protocol):
    """What a lane needs from a tokenizing operator."""

    columns: list[str]
    encoder: TextEncoder

    def encode_rows(self, rows: Sequence[tuple[Any, ...]], where: Sequence[str]
                    ) -> list[Encoded]: ...

    def fingerprint(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class TokenizeSpec:
    """The ``tokenize`` operator's options."""

    field: str = "text"
    """Column holding the document text."""
    tokenizer_id: str | None = None
    """A local tokenizer directory or a Hub id (loaded through transformers)."""
    tokenizer: Any = None
    """A tokenizer object instead of ``tokenizer_id``."""
    add_bos: bool | None = None
    """Prefix each document with BOS. None: when the tokenizer defines a BOS token."""
    add_eos: bool | None = None
    """Suffix each document with EOS. None: when the tokenizer defines an EOS token."""
    max_document_tokens: int | None = None
    """Split longer documents into pieces of at most this many tokens (None: never split)."""
    batch_size: int = 256
    """Documents per backend call; affects speed only."""

    def __post_init__(self) -> None:
        if not self.field or not isinstance(self.field, str):
            raise ConfigError(f"tokenize: field must be a column name, got {self.field!r}")
        if (self.tokenizer_id is None) == (self.tokenizer is None):
            raise ConfigError("tokenize: give exactly one of tokenizer_id=... or tokenizer=...")
        if self.max_document_tokens is not None and self.max_document_tokens < 2:
            raise ConfigError(f"tokenize: max_document_tokens must be >= 2, "
                              f"got {self.max_document_tokens}")
        if self.batch_size <= 0:
            raise ConfigError(f"tokenize: batch_size must be positive, got {self.batch_size}")


class DocumentTokenizer:
    """Runtime side of :class:`TokenizeSpec`."""

    def __init__(self, spec: TokenizeSpec):
        self.spec = spec
        self.columns = [spec.field]
        self.encoder: TextEncoder = resolve_encoder(spec.tokenizer_id, spec.tokenizer)
        special = self.encoder.special
        self.bos = _special(spec.add_bos, special.bos, "add_bos", "BOS")
        self.eos = _special(spec.add_eos, special.eos, "add_eos", "EOS")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "tokenizer": self.encoder.digest,
            "field": self.spec.field,
            "bos": self.bos,
            "eos": self.eos,
            "max_document_tokens": self.spec.max_document_tokens,
        }

    def encode_rows(self, rows: Sequence[tuple[Any, ...]], where: Sequence[str]
                    ) -> list[Encoded]:
        """Rows of (text,) -> documents; ``where`` names each row for error messages."""
        texts = []
        for (value,), label in zip(rows, where, strict=True):
            if value is not None and not isinstance(value, str):
                raise DataError(f"{label}: field {self.spec.field!r} is "
                                f"{type(value).__name__}, expected text")
            texts.append(value or "")
        return [Encoded(pieces) if pieces else Encoded([], skipped="empty")
                for pieces in self.encode(texts)]

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


def _special(asked: bool | None, token: int | None, option: str, name: str) -> int | None:
    if asked is False:
        return None
    if token is None:
        if asked:
            raise ConfigError(f"tokenize: {option}=True but the tokenizer has no {name} token")
        return None
    return token
