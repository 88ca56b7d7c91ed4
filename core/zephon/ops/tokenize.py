"""``tokenize``: text field -> int32 token ids, with BOS/EOS added per document.

Documents are encoded in batches of ``batch_size`` through the Rust backend (see
:mod:`zephon.text.tokenizer`); the batch size changes speed, never the tokens. A document longer
than ``max_document_tokens`` (counting BOS/EOS) is split into consecutive pieces of at most that
many tokens, each packed as its own document; only the first piece carries BOS and only the
last carries EOS. Empty or null texts produce no document and are counted.

BOS and EOS are added by default when the tokenizer defines them, except BOS where it is the
EOS token itself (GPT-2's ``<|endoftext|>``): one separator between documents, as Megatron's
``--append-eod`` data has, not two; ``add_bos=True`` adds it anyway.

Special-token text inside a document (``"<|eos|>"`` in a web page about tokenizers) is encoded
as the plain text it is, never as the control token it spells (``split_special_tokens=True``,
the default; tiktoken refuses such text by default, transformers encodes it as the control
token). Data that embeds its markers on purpose sets ``split_special_tokens=False``. Either way
the tokenizer's own switch does the work (see :mod:`zephon.text.tokenizer`): non-special added
tokens still match, and both settings tokenize at the same speed (measured:
docs/measurements.md).

The engine (``engine``: ``auto``, the default, ``fastokens`` or ``hf``) changes the speed, never
the tokens, and is not part of the checkpoint fingerprint: a run saved with one engine resumes
exactly with the other. ``auto`` encodes with fastokens once it has loaded the tokenizer and
passed a self-check against ``tokenizers`` (until then, and where it is not installed or
refuses the tokenizer, with ``tokenizers``, saying why in one log line); see
:mod:`zephon.text.tokenizer` and :mod:`zephon.text.fast_engine`.

A text holding a surrogate code point (from a JSON escape such as ``\\udc80``) is a DataError
naming the row and the map that cleans it (:func:`zephon.text.tokenizer.replace_surrogates`); it is
found only after the tokenizer refuses a batch, so clean text pays nothing for the check.

A text longer than ``LONG_TEXT_CHARS`` (256 Ki characters) is tokenized in slices, cut where
the tokenizer's definition shows the slices' ids equal the whole text's
(:mod:`zephon.text.long_text`: byte-level and Metaspace BPE, SentencePiece BPE, WordLevel,
WordPiece and Unigram all qualify). One that cannot be cut, or a stretch of one without a place
to cut, is refused above ``max_unsliced_chars`` (2 Mi characters) with an error naming the row
and the tokenizer's kind, rather than encoded whole at 90-175 bytes a character.

With ``max_document_tokens``, a long text is tokenized in slices as its pieces are taken
(:class:`~zephon.ops.base.LazyPieces`), so a 50 MB document holds one slice's tokens and one
piece at a time instead of its 12M tokens; a resume inside it tokenizes the text again up to
the resumed piece. Without the option such a document becomes
one document of all its tokens: the packer then makes every row of it at once, and those rows
wait in the lane's state until they are handed out (about 8 bytes a token), which is logged.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError, DataError
from zephon.logs import get_logger
from zephon.ops.base import (
    BuildContext,
    DocumentOperator,
    DocumentSpec,
    Dropped,
    LazyPieces,
    Outcome,
)
from zephon.records import Doc
from zephon.text.tokenizer import (
    ENGINES,
    LONG_TEXT_CHARS,
    MAX_UNSLICED_CHARS,
    TextEncoder,
    TextTooLong,
    UnencodableText,
    resolve_encoder,
    surrogate_advice,
)

log = get_logger(__name__)


@dataclass(frozen=True)
class TokenizerChoice(DocumentSpec):
    """The tokenizer of an operator that makes token ids (``tokenize``, ``tokenize_chat``)."""

    makes_tokens: ClassVar[bool] = True

    tokenizer_id: str | None = None
    """A local tokenizer directory or a Hub id (loaded through transformers)."""
    tokenizer: Any = dataclasses.field(default=None, metadata={"recipe": False,
                                                              "fingerprint": False})
    """A tokenizer object instead of ``tokenizer_id`` (Python only)."""

    def operator(self) -> TokenizingOperator:
        """The operator these options make (its tokenizer loaded)."""
        raise NotImplementedError

    def build(self, context: BuildContext) -> TokenizingOperator:
        """The operator, its encoder and special tokens shared with the later operators
        (``context``)."""
        operator = self.operator()
        context.encoder = operator.encoder
        context.special = operator.encoder.special
        return operator


@dataclass(frozen=True)
class TokenizeSpec(TokenizerChoice):
    """The ``tokenize`` operator's options."""

    op_name: ClassVar[str] = "tokenize"
    title: ClassVar[str] = "tokenizer or tokenize"

    field: str = "text"
    """Column holding the document text."""
    add_bos: bool | None = None
    """Prefix each document with BOS. None: when the tokenizer defines a BOS token that differs
    from its EOS token (a BOS that is the EOS would double the separator after EOS)."""
    add_eos: bool | None = None
    """Suffix each document with EOS. None: when the tokenizer defines an EOS token."""
    max_document_tokens: int | None = None
    """Split longer documents into pieces of at most this many tokens (None: never split)."""
    split_special_tokens: bool = True
    """Encode special-token text inside a document (``"<|eos|>"``) as plain text (True), or
    as the control token it spells (False: for data that embeds its markers on purpose)."""
    batch_size: int = dataclasses.field(default=256, metadata={"fingerprint": False})
    """Documents per backend call; affects speed only, never the tokens."""
    max_unsliced_chars: int | None = dataclasses.field(default=MAX_UNSLICED_CHARS,
                                                       metadata={"fingerprint": False})
    """A text longer than this that the tokenizer cannot cut into slices (see
    :mod:`zephon.text.long_text`: a tokenizer whose definition gives no safe cut, or a stretch with
    no space between letters or digits) is an error naming its row, instead of being encoded
    whole at 90-175 bytes a character. None: no limit. Never changes the tokens."""
    engine: str = dataclasses.field(default="auto", metadata={"fingerprint": False})
    """``"auto"``: fastokens where it is installed, loads the tokenizer and passes a
    self-check against ``tokenizers``, else ``tokenizers`` (one log line says why);
    ``"fastokens"``: that engine or a ConfigError saying why not; ``"hf"``: ``tokenizers``.
    Affects speed only, never the tokens (see :mod:`zephon.text.tokenizer`)."""

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
        if self.max_unsliced_chars is not None and (
                isinstance(self.max_unsliced_chars, bool)
                or not isinstance(self.max_unsliced_chars, int)
                or self.max_unsliced_chars < LONG_TEXT_CHARS):
            raise ConfigError(f"tokenize: max_unsliced_chars must be an integer of at least "
                              f"{LONG_TEXT_CHARS:,} or None (no limit), got "
                              f"{self.max_unsliced_chars!r}")
        if self.engine not in ENGINES:
            raise ConfigError(f"tokenize: engine must be one of "
                              f"{', '.join(repr(e) for e in ENGINES)}, got {self.engine!r}")

    def operator(self) -> DocumentTokenizer:
        return DocumentTokenizer(self)


class TokenizingOperator(DocumentOperator):
    """What the operators that make token ids share: the vocabulary bound of their encoder and
    the head of their fingerprint (operator, datasets, tokenizer digest, text field), to which
    :meth:`fingerprint_options` adds their own."""

    encoder: TextEncoder
    spec: TokenizerChoice

    @property
    def id_limit(self) -> int:
        return self.encoder.id_limit

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.spec.op_name, "datasets": self.spec.datasets,
                "tokenizer": self.encoder.digest, "field": getattr(self.spec, "field", None),
                **self.fingerprint_options()}

    def fingerprint_options(self) -> dict[str, Any]:
        raise NotImplementedError


class DocumentTokenizer(TokenizingOperator):
    """Runtime side of :class:`TokenizeSpec`."""

    @property
    def releases_gil(self) -> bool:
        """True while ``tokenizers`` encodes: its batch calls spend most of their time with the
        GIL released, so they run on the document threads. False once fastokens encodes: its
        calls take a small fraction of the CPU, so the threads add nothing but more turns at
        the GIL with the training loop: with them, simulated steps ran further over their
        planned time than with the batches on the source's own thread, at the same throughput
        (``benchmarks/trainer_wait.py``; measured: docs/measurements.md)."""
        return not self.encoder.encodes_with_fastokens

    def __init__(self, spec: TokenizeSpec):
        super().__init__(spec)
        self.spec: TokenizeSpec = spec
        self.columns = [spec.field]
        self.batch_size = spec.batch_size
        self.encoder: TextEncoder = resolve_encoder(spec.tokenizer_id, spec.tokenizer,
                                                    spec.split_special_tokens, spec.engine,
                                                    spec.max_unsliced_chars)
        special = self.encoder.special
        self.bos = _special(spec.add_bos, special.bos, "add_bos", "BOS")
        if spec.add_bos is None and self.bos is not None and self.bos == special.eos:
            self.bos = None
        self.eos = _special(spec.add_eos, special.eos, "add_eos", "EOS")
        self._warned_long = False

    def fingerprint_options(self) -> dict[str, Any]:
        return {
            "bos": self.bos,
            "eos": self.eos,
            "max_document_tokens": self.spec.max_document_tokens,
            "split_special_tokens": self.spec.split_special_tokens,
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
        lazy = self._made_lazily(texts)
        out: list[Outcome] = []
        now = [i for i, made_lazily in enumerate(lazy) if not made_lazily]
        try:
            eager = iter(self.encode([texts[i] for i in now]))
        except UnencodableText as exc:
            raise self._unencodable(where[now[exc.index]], exc) from None
        except TextTooLong as exc:
            raise self._too_long(where[now[exc.index]], exc) from None
        for doc, text, made_lazily, label in zip(docs, texts, lazy, where, strict=True):
            if made_lazily:
                out.append(LazyPieces(functools.partial(self._lazy_pieces, doc, text, label)))
                continue
            pieces = next(eager)
            if not pieces:
                out.append(Dropped("empty"))
                continue
            if self.spec.max_document_tokens is None and not self._warned_long \
                    and pieces[0].size > LONG_DOCUMENT_TOKENS:
                self._warned_long = True
                log.warning(
                    "zephon: %s: a document of %s tokens, and tokenize has no "
                    "max_document_tokens: the packer makes all its rows at once and they wait "
                    "in the lane's state (about %d MiB) until handed out. Set "
                    "max_document_tokens (recipes: [tokenize] max_document_tokens) to cut it "
                    "into pieces made as they are needed", label,
                    f"{pieces[0].size:,}", pieces[0].size * 8 >> 20)
            out.append(split_pieces(doc, pieces, None))
        return out

    def _made_lazily(self, texts: list[str]) -> list[bool]:
        """Which texts are cut into pieces as the pieces are taken: those long enough to be
        tokenized in slices, when pieces are asked for, unless all whitespace. Such a document
        is taken to be non-empty: every tokenizer kind gives a text with a non-space character
        at least one token (WordLevel and WordPiece their unknown token), except where a
        normalizer deletes every such character (a text of control characters only, under
        BertNormalizer), which then becomes a document of its BOS and EOS alone."""
        if self.spec.max_document_tokens is None or not self.encoder.sliceable:
            return [False] * len(texts)
        return [len(t) > LONG_TEXT_CHARS and not t.isspace() for t in texts]

    def _unencodable(self, label: str, exc: UnencodableText) -> DataError:
        return DataError(f"{label}: field {self.spec.field!r}, character {exc.at}, holds "
                         f"{surrogate_advice(exc.code, 'tokenize')}")

    def _too_long(self, label: str, exc: TextTooLong) -> DataError:
        return DataError(f"{label}: field {self.spec.field!r} holds {exc.advice('tokenize')}")

    def _lazy_pieces(self, doc: Doc, text: str, label: str) -> Iterator[Doc]:
        """The pieces of one long text, made slice by slice: at most one slice's tokens and
        one piece are held at a time, not the whole document's tokens."""
        limit = self.spec.max_document_tokens
        assert limit is not None
        pending = np.array([self.bos] if self.bos is not None else [], dtype=np.int32)
        offset = doc.doc_start
        for ids in self._slices(text, label):
            pending = np.concatenate([pending, ids])
            cut = pending.size - pending.size % limit
            for start in range(0, cut, limit):
                yield Doc(pending[start:start + limit].copy(), doc.doc_id, doc.dataset, offset)
                offset += limit
            pending = pending[cut:]
        if self.eos is not None:
            pending = np.concatenate([pending, np.array([self.eos], dtype=np.int32)])
        for start in range(0, pending.size, limit):
            piece = pending[start:start + limit]
            yield Doc(piece.copy(), doc.doc_id, doc.dataset, offset)
            offset += piece.size

    def _slices(self, text: str, label: str) -> Iterator[np.ndarray]:
        try:
            yield from self.encoder.slices(text)
        except UnencodableText as exc:
            raise self._unencodable(label, exc) from None
        except TextTooLong as exc:
            raise self._too_long(label, exc) from None

    def encode(self, texts: list[str]) -> list[list[np.ndarray]]:
        """Each text -> its pieces (an empty list for an empty document)."""
        encoded = self.encoder.encode(texts, self.bos, self.eos)
        limit = self.spec.max_document_tokens
        if limit is None:
            return [[doc] if doc.size else [] for doc in encoded]
        return [[doc] if 0 < doc.size <= limit else
                [doc[i:i + limit] for i in range(0, doc.size, limit)] for doc in encoded]


LONG_DOCUMENT_TOKENS = 1 << 20
"""Without ``max_document_tokens``, a document longer than this is logged (once)."""


def split_pieces(doc: Doc, pieces: list[np.ndarray], masks: list[np.ndarray] | None
                 ) -> list[Doc]:
    """Tokenized pieces of ``doc`` as documents carrying their offsets; fields are dropped."""
    if len(pieces) == 1:
        return [Doc(pieces[0], doc.doc_id, doc.dataset, doc.doc_start,
                    masks[0] if masks is not None else None)]
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
