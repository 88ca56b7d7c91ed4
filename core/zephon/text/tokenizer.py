"""Loading tokenizers and encoding text in batches.

Tokenizers are loaded lazily, once per process and id, through ``transformers``. A path that
looks local but does not exist fails at once (no retries against the Hub). A Hub id is first
made a local snapshot of the repository's tokenizer files (:func:`hub_tokenizer_directory`):
one that neither a reachable Hub nor the Hugging Face cache holds is refused at once (asked
with the id, transformers first retries an unreachable Hub for a long while; measured:
docs/measurements.md), and a missing or gated repository is named as such. Loading never
touches the process environment or torch's thread settings: the trainer owns those.

Encoding goes through the Rust ``tokenizers`` backend in batches (it releases the GIL and
parallelizes across documents; batch calls from several threads take turns in its pool,
:mod:`zephon.text.pool_turns`), with truncation and padding switched off so a saved tokenizer
setting cannot silently cut documents: on the backend itself when it was read for the encoder
alone (a directory with ``tokenizer.json``), on a private copy when others may hold it.
With a large vocabulary reading ``tokenizer.json`` is most of the start-up, and building the
encoder in place costs far less than building it on a copy (``benchmarks/startup.py``;
measured: docs/measurements.md).

Engines (``engine``): ``"hf"`` encodes with the ``tokenizers`` backend; ``"fastokens"`` with
fastokens (:mod:`zephon.text.fast_engine`, the ``fast`` extra), loaded from the same JSON and
self-checked against the backend as the encoder is built, or a ConfigError saying why it
cannot be used; ``"auto"`` with fastokens once it is loaded and has passed the self-check,
else with ``tokenizers``, logging one line either way. The engine never changes the ids.
Under ``auto`` fastokens is prepared on a thread of its own, at the trainer's priority, from
the first batch call on: that call encodes with ``tokenizers`` while fastokens loads, so the
first batch does not wait for the load, and every later call waits for it (:class:`_Preparation`
says why waiting pays); an encoder sent to a worker process prepares it again there (it cannot
be pickled), without the check the sending process finished. Offsets
(:meth:`TextEncoder.encode_with_offsets`) always come from ``tokenizers``: fastokens has none.

fastokens calls do not take turns (:mod:`zephon.text.pool_turns`): fastokens spreads each call over
threads of its own (one per core unless ``FASTOKENS_BPE_THREADS`` says otherwise) with the
caller taking part, and concurrent calls share them without one waiting for another's texts
(``python -m benchmarks.throughput`` measures both ways).

Special-token text (``"<|eos|>"`` typed into a document) is encoded as the tokenizer's control
token or, with ``split_special_tokens``, as plain text, by the backend's own switch
(``encode_special_tokens``), so every path (batch calls, long-text slices, offsets, worker
processes) gives the same ids for the same text.

A text over :data:`LONG_TEXT_CHARS` is encoded in slices of about :data:`SLICE_CHARS`, cut
where :mod:`zephon.text.long_text` derives from the tokenizer's definition that the slices' ids
equal the whole text's, and only after a self-check on probe texts agrees (a few ms, once per
process and tokenizer): the Rust tokenizer holds 90-175 bytes a character while it encodes, so
a 50 MB text encoded whole would hold several GiB. A text that cannot be cut (no rule, or a
stretch without a safe cut) over ``max_unsliced_chars`` is refused (:class:`TextTooLong`).

A text holding a surrogate code point (U+D800-U+DFFF: a lone half of a UTF-16 pair, which a
JSON escape such as ``\\udc80`` makes) cannot be encoded by any tokenizer. The backend refuses
the whole batch with a TypeError (a Python tokenizer: UnicodeEncodeError); only then are the
batch's texts searched for the culprit (:func:`find_surrogate`, quick on ASCII and slower on
other text; measured: docs/measurements.md), so clean text pays nothing, and the refusal
becomes :class:`UnencodableText`.
:func:`replace_surrogates` is the repair, as a ``map``.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import zephon.text.fast_engine as fast_engine
import zephon.text.long_text as long_text
from zephon.errors import ConfigError, DataError
from zephon.logs import get_logger
from zephon.text.pool_turns import POOL_TURNS, takes_turn

log = get_logger(__name__)
_LOCK = threading.Lock()
ENGINES = ("auto", "hf", "fastokens")
"""The ``engine`` choices (see the module's docstring)."""
_CACHE: dict[str, Any] = {}

LONG_TEXT_CHARS = 1 << 18
"""Texts longer than this are tokenized in slices (when the tokenizer allows it). The Rust
tokenizer holds about 550 bytes a token while it encodes (offsets, strings), so a slice's
peak above the process is a fraction of a whole 1 MB text's (measured:
docs/measurements.md)."""
SLICE_CHARS = 1 << 18
"""Target characters per slice of a long text (see ``LONG_TEXT_CHARS``)."""
MAX_UNSLICED_CHARS = 1 << 21
"""The default ``max_unsliced_chars``: longer texts (or stretches of them) the tokenizer cannot
cut are refused. Encoded whole, 2 Mi characters hold up to about 350 MiB."""
UNSLICED_BYTES_PER_CHAR = 175
"""The most a text encoded whole held per character, among the kinds of
``benchmarks/long_document.py --whole`` (the figures per kind and size:
docs/measurements.md)."""


def looks_local(tokenizer_id: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else is meant as a local path."""
    return tokenizer_id.startswith((".", "/", "~")) or tokenizer_id.count("/") > 1


def load_tokenizer(tokenizer_id: str) -> Any:
    """A ``transformers`` tokenizer for a local directory or Hub id, cached per process."""
    with _LOCK:
        if tokenizer_id in _CACHE:
            return _CACHE[tokenizer_id]
        source = os.path.expanduser(tokenizer_id)
        if not os.path.isdir(source):
            if looks_local(tokenizer_id):
                raise ConfigError(f"tokenizer_id {tokenizer_id!r}: no such directory")
            source = hub_tokenizer_directory(tokenizer_id)
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except Exception as exc:  # transformers raises OSError, ValueError...
            raise ConfigError(f"cannot load tokenizer {tokenizer_id!r}: {exc}") from exc
        _CACHE[tokenizer_id] = tokenizer
        return tokenizer


TOKENIZER_FILES = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.vocab")
"""What transformers may read from a repository to build its tokenizer: configs, vocabularies
and merges, SentencePiece and tiktoken models, chat templates. Weights never match."""


def hub_tokenizer_directory(repo_id: str) -> str:
    """The local snapshot of a Hub repository's tokenizer files (:data:`TOKENIZER_FILES`, at
    ``main``), downloaded into the Hugging Face cache by huggingface_hub. When the Hub cannot
    be reached (or ``HF_HUB_OFFLINE`` is set) the cached snapshot is used without retries;
    with none, and for a missing or gated repository, a ConfigError names the id and what
    to do."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from zephon.io.hub.client import default_endpoint
    from zephon.io.hub.retry import LOGIN

    endpoint = default_endpoint()
    try:
        return snapshot_download(repo_id, allow_patterns=list(TOKENIZER_FILES),
                                 endpoint=endpoint)
    except GatedRepoError as exc:
        raise ConfigError(f"tokenizer {repo_id!r} is a gated model: accept its conditions at "
                          f"{endpoint}/{repo_id}, then {LOGIN}") from exc
    except RepositoryNotFoundError as exc:
        raise ConfigError(f"tokenizer {repo_id!r}: no such model repository on {endpoint} "
                          f"(a private one needs a token: {LOGIN}); or give a local "
                          "directory") from exc
    except LocalEntryNotFoundError as exc:
        why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
               else f"the Hub ({endpoint}) cannot be reached")
        raise ConfigError(f"tokenizer {repo_id!r}: {why} and it is not in the Hugging Face "
                          f"cache ({constants.HF_HUB_CACHE}); load it once where the Hub is "
                          "reachable, or give a local directory") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ConfigError(f"tokenizer {repo_id!r}: {exc}") from exc


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int | None
    pad: int | None


class UnencodableText(DataError):
    """A text the tokenizer cannot take: ``index`` in the texts of the call, the surrogate
    code point ``code`` at character ``at``. Operators turn it into an error naming the row."""

    def __init__(self, index: int, at: int, code: int):
        super().__init__(index, at, code)
        self.index, self.at, self.code = index, at, code

    def __str__(self) -> str:
        return (f"text {self.index} holds the surrogate code point U+{self.code:04X} at "
                f"character {self.at}, which is not Unicode text and no tokenizer encodes")


class TextTooLong(DataError):
    """A text (``index`` in the texts of the call) with ``length`` characters from ``start``
    that the tokenizer cannot cut (``why``), over the ``limit`` of ``max_unsliced_chars``.
    Operators turn it into an error naming the row."""

    def __init__(self, index: int, start: int, length: int, limit: int, kind: str, why: str):
        super().__init__(index, start, length, limit, kind, why)
        self.index, self.start, self.length, self.limit = index, start, length, limit
        self.kind, self.why = kind, why

    def __str__(self) -> str:
        return (f"text {self.index}: {self.advice('tokenize')}")

    def advice(self, op: str) -> str:
        """What the text holds, why it cannot be cut and what to set, for ``op``."""
        where = "" if self.start == 0 else f" from character {self.start:,}"
        return (f"{self.length:,} characters{where} that the tokenizer, a {self.kind}, cannot "
                f"cut into slices ({self.why}); encoding them whole would hold about "
                f"{self.length * UNSLICED_BYTES_PER_CHAR >> 20:,} MiB, over {op}'s "
                f"max_unsliced_chars of {self.limit:,}. Raise {op}(max_unsliced_chars=...) "
                f"(recipes: [{op}] max_unsliced_chars; None: no limit) or leave such "
                "documents out with a filter")


def surrogate_advice(code: int, op: str) -> str:
    """The end of an error message about the surrogate code point ``code`` met by ``op``:
    what it is and the map that cleans it."""
    return (f"the surrogate code point U+{code:04X} (a lone half of a UTF-16 pair, as the JSON "
            f"escape \\u{code:04x} makes), which is not Unicode text and no tokenizer encodes; "
            f"replace such characters by U+FFFD before {op} with the map "
            "zephon.text.tokenizer.replace_surrogates (Python: .map(replace_surrogates); recipes: "
            '[[ops]] op = "map", fn = "zephon.text.tokenizer:replace_surrogates")')


def find_surrogate(texts: list[str]) -> tuple[int, int, int] | None:
    """(index of the text, character, code point) of the first surrogate code point in
    ``texts``, or None. Strict UTF-8 encoding stops at the first one, in C."""
    for index, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return index, exc.start, ord(text[exc.start])
    return None


def refusal(texts: list[str], exc: Exception) -> Exception:
    """What to raise when the backend refused ``texts`` with ``exc``: :class:`UnencodableText`
    when a text holds a surrogate, else ``exc`` itself."""
    found = find_surrogate(texts)
    return UnencodableText(*found) if found is not None else exc


_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(document: dict[str, Any]) -> dict[str, Any]:
    """A ``map`` function: ``document`` with every surrogate code point (U+D800-U+DFFF) in its
    text, in nested lists and dicts too (chat messages), replaced by U+FFFD, the replacement
    character that ``errors="replace"`` decoding puts in place of bytes that are not text.
    Pair halves that happen to stand side by side are replaced one by one as well (JSON
    readers join valid pairs before this sees them). Opt-in, as it costs a pass over every
    string: ``.map(replace_surrogates)``, or in recipes ``[[ops]] op = "map"``,
    ``fn = "zephon.text.tokenizer:replace_surrogates"``."""
    return _replaced(document)


def _replaced(value: Any) -> Any:
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {k: _replaced(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replaced(v) for v in value]
    return value


class TextEncoder:
    """Batch text -> int32 token arrays, without special tokens (the caller adds BOS/EOS).

    ``split_special_tokens``: special-token text in a text is encoded as plain text (True) or
    as the control token it spells (False, the tokenizer's own default). ``engine``: ``"hf"``,
    ``"fastokens"`` or ``"auto"`` (see the module's docstring); :attr:`engine` says which one
    encodes. ``max_unsliced_chars``: the longest text, or stretch of one, encoded whole where
    it cannot be cut into slices (None: no limit); longer ones raise :class:`TextTooLong`."""

    def __init__(self, tokenizer: Any, split_special_tokens: bool = False, engine: str = "hf",
                 max_unsliced_chars: int | None = MAX_UNSLICED_CHARS):
        if engine not in ENGINES:
            raise ConfigError(f"engine={engine!r} is not one of "
                              f"{', '.join(repr(e) for e in ENGINES)}")
        if max_unsliced_chars is not None and max_unsliced_chars < LONG_TEXT_CHARS:
            raise ConfigError(f"max_unsliced_chars must be at least {LONG_TEXT_CHARS:,} (or "
                              f"None: no limit), got {max_unsliced_chars!r}")
        self.tokenizer = tokenizer
        self._split_special = bool(split_special_tokens)
        self._unsliced_limit = max_unsliced_chars
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None and type(tokenizer).__module__.startswith("tokenizers"):
            backend = tokenizer
        self._backend = None
        serialized = None
        if backend is not None:
            from tokenizers import Tokenizer

            serialized = backend.to_str()
            self._digest = hashlib.sha256(serialized.encode()).hexdigest()[:16]
            # A tokenizer read for encoders alone is changed in place; any other is copied, as
            # its owner may rely on its settings: once per process, digest and setting.
            if isinstance(tokenizer, _SavedFastTokenizer):
                self._backend = _configured(backend, self._split_special)
            else:
                key = (self._digest, self._split_special)
                with _LOCK:
                    copy = _COPIES.get(key)
                if copy is None:
                    copy = _configured(Tokenizer.from_str(serialized), self._split_special)
                    with _LOCK:
                        copy = _COPIES.setdefault(key, copy)
                self._backend = copy
            self._cuts = _checked_cuts(self._backend, serialized, self._digest,
                                       self._split_special)
        else:
            self._cuts = long_text.NoCuts(type(tokenizer).__name__, "it has no Rust backend "
                                          "(tokenizer.json) to derive safe cuts from")
            vocab = sorted(tokenizer.get_vocab().items())
            self._digest = hashlib.sha256(repr(vocab).encode()).hexdigest()[:16]
            if self._split_special:
                _check_splits(tokenizer)
        self._fast_batch = getattr(self._backend, "encode_batch_fast", None)
        self.special = SpecialTokens(
            bos=_token_id(tokenizer, "bos"),
            eos=_token_id(tokenizer, "eos"),
            pad=_token_id(tokenizer, "pad"),
        )
        self._fast: Any = None
        """The fastokens tokenizer, once it encodes."""
        self._fast_note: str | None = None
        """Why fastokens does not encode, when it was asked for and declined."""
        self._preparing: _Preparation | None = None
        """fastokens being made ready (``engine="auto"``, worker processes)."""
        if engine == "fastokens":
            try:
                self._fast = self._checked_fast(serialized, announce=True)
            except fast_engine.Unusable as exc:
                raise ConfigError(f"engine='fastokens' cannot be used: {exc}; engine='auto' "
                                  "falls back to tokenizers") from None
        elif engine == "auto":
            self._prepare(serialized, check=True, announce=True)

    def _prepare(self, serialized: str | None, check: bool, announce: bool) -> None:
        """Have fastokens made ready from the first batch call on (:class:`_Preparation`),
        later calls waiting for it."""
        with _LOCK:
            known = _FAST.get((self._digest, self._split_special))
        if isinstance(known, fast_engine.Unusable):
            self._fast_note = str(known)
            return
        if known is not None:
            self._fast = known
            return
        self._preparing = _Preparation(self, serialized, check, announce)

    def _checked_fast(self, serialized: str | None, announce: bool) -> Any:
        """fastokens for this encoder, loaded and self-checked against the backend; raises
        :class:`~zephon.text.fast_engine.Unusable`. Logs the engine used when ``announce``."""
        if self._backend is None:
            raise fast_engine.Unusable(f"{type(self.tokenizer).__name__} has no Rust backend "
                                       "(tokenizer.json) for fastokens to read")
        key = (self._digest, self._split_special)
        with _LOCK:
            known = _FAST.get(key)
        if isinstance(known, fast_engine.Unusable):
            raise known
        if known is not None:
            return known
        start = time.perf_counter()
        try:
            fast = fast_engine.load(serialized if serialized is not None
                                    else self._backend.to_str())
            loaded = time.perf_counter() - start
            texts, seconds = fast_engine.self_check(fast, self._backend, self._split_special,
                                                    LONG_TEXT_CHARS)
        except fast_engine.Unusable as exc:
            with _LOCK:
                _FAST[key] = exc
            raise
        with _LOCK:
            _FAST[key] = fast
        if announce:
            log.info("zephon: tokenizer %s encodes with fastokens %s (loaded in %.2f s; its ids "
                     "equal tokenizers' on %d self-check texts, checked in %.0f ms)",
                     self._digest, fast_engine.version(), loaded, texts, seconds * 1e3)
        return fast

    def _declined(self, note: str, announce: bool, level: int) -> None:
        self._fast_note = note
        if announce:
            log.log(level, "zephon: tokenizer %s encodes with tokenizers, not fastokens: %s",
                    self._digest, note)

    def _start_preparing(self) -> _Preparation | None:
        """The preparation of fastokens, started (again in a process forked while it ran: its
        thread does not exist there); None when there is none."""
        preparing = self._preparing
        if preparing is None:
            return None
        if preparing.pid != os.getpid() and not preparing.ready.is_set():
            preparing = self._preparing = preparing.again()
        preparing.start()
        return preparing

    @property
    def engine(self) -> str:
        """The engine that encodes: ``"fastokens"``, ``"tokenizers"`` or ``"transformers"``
        (a tokenizer without Rust backend); while fastokens is being prepared, waits for it."""
        preparing = self._start_preparing()
        if preparing is not None:
            preparing.ready.wait()
        if self._fast is not None:
            return "fastokens"
        return "tokenizers" if self._backend is not None else "transformers"

    @property
    def encodes_with_fastokens(self) -> bool:
        """Whether fastokens encodes now (never waits for a preparation in progress)."""
        return self._fast is not None

    @property
    def engine_note(self) -> str | None:
        """Why fastokens does not encode, when it was asked for (``auto``) and declined."""
        return self._fast_note if self.engine != "fastokens" else None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for worker processes without the full tokenizer when the backend alone
        encodes: one copy of the vocabulary travels, not two. fastokens cannot be pickled:
        the worker prepares it again, with the self-check only when this process had not
        finished its own."""
        state = dict(self.__dict__)
        if self._backend is not None:
            state["tokenizer"] = None
        preparing = self._preparing
        state["_fast_again"] = "load" if self._fast is not None else \
            None if preparing is None else "check" if preparing.check else "load"
        state["_fast"] = state["_preparing"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The backend's ``encode_special_tokens`` switch does not survive pickling: set
        again."""
        again = state.pop("_fast_again", None)
        self.__dict__.update(state)
        if self._backend is not None:
            self._backend.encode_special_tokens = self._split_special
        if again is not None:
            self._prepare(None, check=again == "check", announce=False)

    @property
    def split_special_tokens(self) -> bool:
        """Whether special-token text is encoded as plain text."""
        return self._split_special

    @property
    def digest(self) -> str:
        """A short hash of the tokenizer's full definition (vocabulary, merges, normalizer)."""
        return self._digest

    @property
    def id_limit(self) -> int:
        """Every id this encoder gives is below this: the vocabulary with its added tokens
        (the largest id plus one where ids leave gaps); found once."""
        limit = self.__dict__.get("_id_limit")
        if limit is None:
            vocab = self._backend.get_vocab(with_added_tokens=True) \
                if self._backend is not None else self.tokenizer.get_vocab()
            limit = self._id_limit = max(vocab.values(), default=-1) + 1
        return limit

    def encode_with_offsets(self, text: str) -> Any:
        """One text -> a tokenizers Encoding (ids and character offsets), no special tokens."""
        if self._backend is None:
            raise ConfigError("character offsets need a fast (Rust-backed) tokenizer")
        try:
            return self._backend.encode(text, add_special_tokens=False)
        except TypeError as exc:
            raise refusal([text], exc) from None

    def encode(self, texts: list[str], bos: int | None = None, eos: int | None = None
               ) -> list[np.ndarray]:
        """Each text's ids, each non-empty text's framed by ``bos`` and ``eos`` where given
        (fastokens frames them in its one buffer a call); texts over
        :data:`LONG_TEXT_CHARS` go through :meth:`slices`, the others through one batch call.
        A batch call of :data:`~zephon.text.pool_turns.MIN_TEXTS` texts or more takes its turn in
        the tokenizer's pool (:mod:`zephon.text.pool_turns`) with its texts longest first; the ids
        come back in the order given. A text the backend refuses raises
        :class:`UnencodableText` naming its index in ``texts``."""
        try:
            return self._encode(texts, bos, eos)
        except (TypeError, UnicodeError, UnencodableText) as exc:
            raise refusal(texts, exc) from None

    def _encode(self, texts: list[str], bos: int | None, eos: int | None) -> list[np.ndarray]:
        if max(map(len, texts), default=0) <= LONG_TEXT_CHARS:
            return self._encode_batch(texts, bos, eos)
        if not self.sliceable:
            limit = self._unsliced_limit
            for index, text in enumerate(texts):
                if limit is not None and len(text) > limit:
                    raise self._too_long(index, 0, len(text))
            return self._encode_batch(texts, bos, eos)
        short = iter(self._encode_batch([t for t in texts if len(t) <= LONG_TEXT_CHARS]))
        return framed([np.concatenate(list(self.slices(t))) if len(t) > LONG_TEXT_CHARS
                       else next(short) for t in texts], bos, eos)

    def _encode_batch(self, texts: list[str], bos: int | None = None, eos: int | None = None
                      ) -> list[np.ndarray]:
        if not texts:
            return []
        preparing = self._preparing
        if self._fast is None and preparing is not None:
            started = self._start_preparing()
            if preparing.first_call:
                preparing.first_call = False
            elif started is not None:
                started.ready.wait()
        fast = self._fast
        if fast is not None:
            return fast_engine.encode(fast, texts, self._split_special, bos, eos)
        return framed(self._encode_tokenizers(texts), bos, eos)

    def _encode_tokenizers(self, texts: list[str]) -> list[np.ndarray]:
        if self._backend is not None:
            batch = self._fast_batch or self._backend.encode_batch
            if not takes_turn(len(texts)):
                return [ids_array(e.ids) for e in batch(texts, add_special_tokens=False)]
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
            encodings = POOL_TURNS.run(batch, [texts[i] for i in order], add_special_tokens=False)
            ids: list[Any] = [None] * len(texts)
            for i, encoding in zip(order, encodings, strict=True):
                ids[i] = ids_array(encoding.ids)
            return ids
        options = {"split_special_tokens": True} if self._split_special else {}
        ids = self.tokenizer(texts, add_special_tokens=False, **options)["input_ids"]
        return [np.asarray(x, dtype=np.int32) for x in ids]

    @property
    def sliceable(self) -> bool:
        """Whether long texts are tokenized in slices (see :meth:`slices`)."""
        return isinstance(self._cuts, long_text.CutRule)

    @property
    def cuts(self) -> long_text.CutRule | long_text.NoCuts:
        """Where long texts are cut (:mod:`zephon.text.long_text`), or why they are not."""
        return self._cuts

    def slices(self, text: str) -> Iterator[np.ndarray]:
        """The ids of ``text``, one slice of about :data:`SLICE_CHARS` characters at a time.

        Slices are cut where the tokenizer's :mod:`~zephon.text.long_text` rule allows, so their
        ids equal whole-text tokenization (tested for every kind of tokenizer) while the
        tokenizer's per-token bookkeeping (about 550 bytes a token) is held for one slice at a
        time. A tokenizer that is not :attr:`sliceable` gives the whole text as one slice. A
        text (or, when sliceable, a stretch without a cut) longer than ``max_unsliced_chars``
        raises :class:`TextTooLong`; a refused text raises :class:`UnencodableText` (index 0,
        the character counted in ``text``)."""
        cuts = self._cuts
        limit = self._unsliced_limit
        if not isinstance(cuts, long_text.CutRule):
            if limit is not None and len(text) > limit:
                raise self._too_long(0, 0, len(text))
            yield self._encode_slice(text, text)
            return
        try:
            for _start, piece in cuts.pieces(text, SLICE_CHARS, limit):
                yield self._encode_slice(piece, text)
        except long_text.LongStretch as exc:
            raise self._too_long(0, exc.start, exc.length) from None

    def _too_long(self, index: int, start: int, length: int) -> TextTooLong:
        cuts = self._cuts
        why = cuts.reason if isinstance(cuts, long_text.NoCuts) else \
            "it holds no space between letters or digits to cut at"
        assert self._unsliced_limit is not None
        return TextTooLong(index, start, length, self._unsliced_limit, cuts.kind, why)

    def _encode_slice(self, piece: str, text: str) -> np.ndarray:
        try:
            return self._encode_batch([piece])[0]
        except (TypeError, UnicodeError) as exc:
            raise refusal([text], exc) from None


class _Preparation:
    """fastokens made ready for ``encoder`` on a thread of its own: loaded (from
    ``serialized``, or the backend's JSON) and, with ``check``, self-checked; the engine
    announced in the log when ``announce``.

    The thread starts (:meth:`start`) with the encoder's first batch call, or when someone
    asks which engine encodes. That first call encodes with ``tokenizers`` meanwhile, so the
    first batch never waits for the load; every later call waits until fastokens is ready
    (or declined). Waiting pays: fastokens encodes many times as fast as ``tokenizers``
    (measured: docs/measurements.md), so whatever ``tokenizers`` would encode during the load,
    fastokens encodes in a small fraction of that time once loaded, and ``tokenizers``, which
    takes every core, would slow the load itself. The thread runs at the caller's priority:
    at the lowest (nice 19) it starved on a busy host, for longer than short runs last.

    The thread is not a daemon: one that Python stops at exit while fastokens runs aborts the
    process (``FATAL: exception not rethrown``); exit waits for it instead (at most the
    load)."""

    def __init__(self, encoder: TextEncoder, serialized: str | None, check: bool,
                 announce: bool):
        self.encoder, self.serialized = encoder, serialized
        self.check, self.announce = check, announce
        self.first_call = True
        """No batch call has begun yet: the next one encodes without waiting."""
        self.pid = os.getpid()
        self.ready = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def again(self) -> _Preparation:
        """The same preparation, not started (for a forked process)."""
        return _Preparation(self.encoder, self.serialized, self.check, self.announce)

    def start(self) -> None:
        """Start the thread, once."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name="zephon-fastokens").start()

    def _run(self) -> None:
        encoder = self.encoder
        try:
            if self.check:
                encoder._fast = encoder._checked_fast(self.serialized, self.announce)
            else:
                assert encoder._backend is not None
                encoder._fast = fast_engine.load(self.serialized if self.serialized is not None
                                                 else encoder._backend.to_str())
        except fast_engine.Unusable as exc:
            encoder._declined(str(exc), self.announce, logging.WARNING
                              if isinstance(exc, fast_engine.Differs) else logging.INFO)
        except Exception as exc:
            encoder._declined(f"preparing fastokens failed: {exc!r}", self.announce,
                              logging.WARNING)
        finally:
            self.serialized = None
            if encoder._preparing is self:
                encoder._preparing = None
            self.ready.set()


def framed(ids: list[np.ndarray], bos: int | None, eos: int | None) -> list[np.ndarray]:
    """Each non-empty array between ``bos`` and ``eos`` where given (an empty one stays
    empty)."""
    if bos is None and eos is None:
        return ids
    parts = [np.array([t], dtype=np.int32) if t is not None else None for t in (bos, eos)]
    return [np.concatenate([p for p in (parts[0], x, parts[1]) if p is not None]) if x.size
            else x for x in ids]


def ids_array(ids: list[int]) -> np.ndarray:
    """A list of token ids -> an int32 array, through ``array('I')``, which costs less a
    token than ``np.array(ids, dtype=np.int32)`` (measured: docs/measurements.md). Ids are
    below 2**31 (no vocabulary comes near), so the unsigned buffer reads as int32 unchanged."""
    return np.frombuffer(array.array("I", ids), dtype=np.int32)


def _checked_cuts(backend: Any, serialized: str, digest: str, split_special: bool
                  ) -> long_text.CutRule | long_text.NoCuts:
    """The cut rule of a tokenizer's definition, kept only when its :func:`self-check
    <zephon.text.long_text.self_check>` passes; once per process and tokenizer (a few ms)."""
    key = (digest, split_special)
    with _LOCK:
        known = _CUTS.get(key)
    if known is not None:
        return known
    cuts = long_text.cut_rule(serialized)
    if isinstance(cuts, long_text.CutRule):
        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

        differs = long_text.self_check(cuts, encode, list(cuts.added))
        if differs is not None:
            log.warning("zephon: tokenizer %s: long texts are not cut into slices: %s",
                        digest, differs)
            cuts = long_text.NoCuts(cuts.kind, differs)
    with _LOCK:
        _CUTS[key] = cuts
    return cuts


def _configured(backend: Any, split_special: bool) -> Any:
    """``backend`` set to encode without truncation or padding (a saved setting must not cut
    documents), with special-token text split or not."""
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = split_special
    return backend


_COPIES: dict[tuple[str, bool], Any] = {}
"""Configured copies of tokenizers that others own, by digest and ``split_special_tokens``."""
_CUTS: dict[tuple[str, bool], long_text.CutRule | long_text.NoCuts] = {}
_FAST: dict[tuple[str, bool], Any] = {}
"""fastokens per tokenizer digest and ``split_special_tokens``, once self-checked in this
process (or why it cannot be used): loaded once and shared by every encoder, as the
``tokenizers`` backend is (:func:`_saved_fast_tokenizer`): loading takes time and memory that
grow with the vocabulary (measured: docs/measurements.md)."""


def _check_splits(tokenizer: Any) -> None:
    """Refuse a tokenizer without a backend that cannot encode special-token text as plain
    text (transformers' Mistral tokenizer): asked once, on a short text."""
    try:
        tokenizer(["x"], add_special_tokens=False, split_special_tokens=True)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ConfigError(f"split_special_tokens=True: {type(tokenizer).__name__} cannot "
                          f"encode special-token text as plain text ({exc}); set "
                          "split_special_tokens=False") from None


def _token_id(tokenizer: Any, kind: str) -> int | None:
    value = getattr(tokenizer, f"{kind}_token_id", None)
    return int(value) if value is not None else None


class _SavedFastTokenizer:
    """The parts of a saved fast tokenizer the data path needs, read without transformers.

    Importing transformers is slow (and imports torch; measured: docs/measurements.md); a
    directory holding ``tokenizer.json`` and a ``tokenizer_config.json`` that names its special
    tokens is read with the ``tokenizers`` library alone. Anything else goes through
    transformers.
    """

    def __init__(self, directory: str):
        from tokenizers import Tokenizer

        path = os.path.join(directory, "tokenizer.json")
        try:
            self.backend_tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises a bare Exception for a damaged file
            raise ConfigError(f"tokenizer {path} cannot be read ({exc}): the file is damaged "
                              "or truncated; copy it again from where the tokenizer came from"
                              ) from None
        config = json.loads(Path(directory, "tokenizer_config.json").read_text())
        for kind in ("bos", "eos", "pad"):
            value = config.get(f"{kind}_token")
            if isinstance(value, dict):
                value = value.get("content")
            token_id = self.backend_tokenizer.token_to_id(value) if value else None
            setattr(self, f"{kind}_token_id", token_id)

    @classmethod
    def try_load(cls, tokenizer_id: str) -> _SavedFastTokenizer | None:
        directory = os.path.expanduser(tokenizer_id)
        config_path = Path(directory, "tokenizer_config.json")
        if not (Path(directory, "tokenizer.json").is_file() and config_path.is_file()):
            return None
        try:
            config = json.loads(config_path.read_text())
        except ValueError:
            return None
        if not config.get("eos_token"):
            return None
        loaded = cls(directory)
        return loaded if loaded.eos_token_id is not None else None


def _saved_fast_tokenizer(tokenizer_id: str, split_special_tokens: bool
                          ) -> _SavedFastTokenizer | None:
    """The saved fast tokenizer of a directory (:class:`_SavedFastTokenizer`), read once per
    process and ``split_special_tokens`` setting while its ``tokenizer.json`` is unchanged
    (size and modification time): encoders change their backend's special-token switch in
    place, so the two settings each have their own. A ``tokenizers.Tokenizer`` keeps memory
    after use: read again per pipeline, an evaluation loop that builds and drops pipelines
    grew with each one (measured: docs/measurements.md)."""
    try:
        stat = os.stat(os.path.join(os.path.expanduser(tokenizer_id), "tokenizer.json"))
    except OSError:
        return None
    key = (tokenizer_id, bool(split_special_tokens), stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        if key in _SAVED:
            return _SAVED[key]
    loaded = _SavedFastTokenizer.try_load(tokenizer_id)
    with _LOCK:
        for old in [k for k in _SAVED if k[:2] == key[:2]]:
            del _SAVED[old]  # the file changed: forget its earlier reading
        return _SAVED.setdefault(key, loaded)


_SAVED: dict[tuple[str, bool, int, int], _SavedFastTokenizer | None] = {}


def resolve_encoder(tokenizer_id: str | None, tokenizer: Any | None,
                    split_special_tokens: bool = False, engine: str = "hf",
                    max_unsliced_chars: int | None = MAX_UNSLICED_CHARS) -> TextEncoder:
    """The encoder of exactly one of a tokenizer id (loaded, see :func:`load_tokenizer`) or
    a tokenizer object; the options as in :class:`TextEncoder`."""
    if (tokenizer_id is None) == (tokenizer is None):
        raise ConfigError("give exactly one of tokenizer_id=... or tokenizer=...")
    if tokenizer is None:
        with _LOCK:
            cached = _CACHE.get(tokenizer_id)
        tokenizer = cached or _saved_fast_tokenizer(tokenizer_id, split_special_tokens) or \
            load_tokenizer(tokenizer_id)
    return TextEncoder(tokenizer, split_special_tokens, engine, max_unsliced_chars)
