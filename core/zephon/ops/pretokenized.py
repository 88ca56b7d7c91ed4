"""``pretokenized``: documents that are token ids already, in place of ``tokenize``.

The ids come from a list-of-integers column (``field``) of Parquet, Arrow or JSON Lines data, or
from a Megatron indexed dataset (whose one column is ``input_ids``). Parquet and Arrow columns
and indexed datasets reach this operator as numpy views, never as Python lists of ints. Each
document optionally gets ``bos_token_id`` before it and ``eos_token_id`` after it (data made by
Megatron's ``preprocess_data.py --append-eod`` already ends in EOD: add nothing), is checked
against ``vocab_size`` and split like ``tokenize`` output by ``max_document_tokens``. An empty
list or a null produces no document and is counted as ``empty``.

Ids are checked in the type they were stored in, before the one cast to int32: they must be
integers (a float or bool array, or a JSON number that is not an integer, is an error), not
negative, and below ``vocab_size``, or below 2**31 when no vocabulary is given, so no id can
wrap around in the cast. The check is at most one min and one max per document, fewer where
the stored dtype cannot pass a bound (uint16 ids need neither without a vocabulary).
"""

from __future__ import annotations

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
from zephon.ops.tokenize import split_pieces
from zephon.records import Doc
from zephon.text.tokenizer import SpecialTokens

ID_LIMIT = 2**31
"""Token ids leave this operator as int32: every id must lie below this."""


@dataclass(frozen=True)
class PretokenizedSpec(DocumentSpec):
    """Options of ``pretokenized``."""

    op_name: ClassVar[str] = "pretokenized"
    title: ClassVar[str] = "pretokenized"
    makes_tokens: ClassVar[bool] = True

    field: str = "input_ids"
    """Column holding each document's token ids (a list of integers)."""
    bos_token_id: int | None = None
    """Id put before every document (None: nothing)."""
    eos_token_id: int | None = None
    """Id put after every document (None: nothing); also the padding fallback and the id
    ``eos_mask_loss`` uses."""
    vocab_size: int | None = None
    """Ids must lie in ``[0, vocab_size)``; an id outside is an error naming file and row
    (None: ids must still lie in ``[0, 2**31)``, the range of the int32 ids it hands on)."""
    max_document_tokens: int | None = None
    """Split longer documents into pieces of at most this many tokens (None: never split)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.field or not isinstance(self.field, str):
            raise ConfigError(f"pretokenized: field must be a column name, got {self.field!r}")
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value < ID_LIMIT):
                raise ConfigError(f"pretokenized: {name} must be a non-negative int below "
                                  f"2**31, got {value!r}")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int)
                                            or self.vocab_size <= 0):
            raise ConfigError(f"pretokenized: vocab_size must be positive, got "
                              f"{self.vocab_size!r}")
        if self.vocab_size is not None and self.vocab_size > ID_LIMIT:
            raise ConfigError(f"pretokenized: vocab_size={self.vocab_size} does not fit the "
                              f"int32 token ids it hands on (at most {ID_LIMIT})")
        if self.vocab_size is not None:
            for name in ("bos_token_id", "eos_token_id"):
                value = getattr(self, name)
                if value is not None and value >= self.vocab_size:
                    raise ConfigError(f"pretokenized: {name}={value} is not below "
                                      f"vocab_size={self.vocab_size}")
        if self.max_document_tokens is not None and self.max_document_tokens < 2:
            raise ConfigError(f"pretokenized: max_document_tokens must be >= 2, "
                              f"got {self.max_document_tokens}")

    def build(self, context: BuildContext) -> Pretokenized:
        context.special = SpecialTokens(bos=self.bos_token_id, eos=self.eos_token_id, pad=None)
        return Pretokenized(self)


class Pretokenized(DocumentOperator):
    def __init__(self, spec: PretokenizedSpec):
        super().__init__(spec)
        self.spec: PretokenizedSpec = spec
        self.columns = [spec.field]
        self._bos = np.array([spec.bos_token_id], np.int32) if spec.bos_token_id is not None \
            else None
        self._eos = np.array([spec.eos_token_id], np.int32) if spec.eos_token_id is not None \
            else None
        self._limit = spec.vocab_size if spec.vocab_size is not None else ID_LIMIT
        self._checks: dict[np.dtype, tuple[bool, bool]] = {}

    @property
    def id_limit(self) -> int:
        return self._limit

    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        out: list[Outcome] = []
        limit = self.spec.max_document_tokens
        for doc, label in zip(docs, where, strict=True):
            ids = self._ids(doc, label)
            if ids is None or ids.size == 0:
                out.append(Dropped("empty"))
                continue
            parts = [p for p in (self._bos, ids, self._eos) if p is not None]
            tokens = np.concatenate(parts) if len(parts) > 1 else ids
            pieces = [tokens] if limit is None or tokens.size <= limit else \
                [tokens[i:i + limit] for i in range(0, tokens.size, limit)]
            out.append(split_pieces(doc, pieces, None))
        return out

    def _ids(self, doc: Doc, label: Any) -> np.ndarray | None:
        fields = doc.fields or {}
        name = self.spec.field
        if name not in fields:
            raise DataError(f"{label}: missing field {name!r} (has {sorted(fields)})")
        value = fields[name]
        if value is None:
            return None
        if not isinstance(value, np.ndarray):
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise DataError(f"{label}: field {name!r} is {_kind(value)}, expected a list "
                                "of token ids (integers)")
            try:
                value = np.asarray(value, dtype=np.int64)
            except OverflowError:  # JSON integers have no size limit; int64 does
                bad = next(v for v in value if not -2**63 <= v < 2**63)
                raise self._range_error(label, bad) from None
        elif value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
            raise DataError(f"{label}: field {name!r} holds {value.dtype} values of shape "
                            f"{value.shape}, expected a list of token ids (integers)")
        if value.size:
            check_low, check_high = self._bounds(value.dtype)
            if check_low and (low := int(value.min())) < 0:
                raise self._range_error(label, low)
            if check_high and (high := int(value.max())) >= self._limit:
                raise self._range_error(label, high)
        return value.astype(np.int32, copy=False)

    def _bounds(self, dtype: np.dtype) -> tuple[bool, bool]:
        """Whether ids of ``dtype`` need a min check and a max check: not for a bound the
        dtype cannot pass (uint16 ids need neither without a vocabulary). Each reduction is a
        pass and a call overhead per document, a visible share of a pass over indexed data
        (measured: docs/measurements.md)."""
        found = self._checks.get(dtype)
        if found is None:
            info = np.iinfo(dtype)
            found = self._checks[dtype] = (info.min < 0, info.max >= self._limit)
        return found

    def _range_error(self, label: Any, bad: int) -> DataError:
        why = "" if self.spec.vocab_size is not None else \
            " (no vocab_size: token ids must fit int32)"
        return DataError(f"{label}: field {self.spec.field!r} holds token id {bad}, outside "
                         f"[0, {self._limit}){why}")


def _kind(value: Any) -> str:
    if isinstance(value, (list, tuple)) and value:
        return f"a list of {type(value[0]).__name__}"
    return type(value).__name__
