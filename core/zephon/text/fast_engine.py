"""The fast tokenizer engine: ``fastokens`` (Rust) reading the same ``tokenizer.json`` as the
``tokenizers`` backend, used only where a self-check shows it gives the same ids.

:func:`load` builds it from the backend's JSON, truncation and padding off; it refuses what
it does not implement (an NFKC normalizer, a Metaspace pre-tokenizer, a Unigram model),
which :class:`Unusable` reports. :func:`encode` turns one batch call
(``encode_batch_flat``: every text's ids in one little-endian uint32 buffer, the bounds in a
second) into an int32 array per text with no Python object per token: one copy of the
buffer (so the arrays are writable) and one view per text.

:func:`self_check` encodes a fixed set of texts with both engines (the encoder's own
``split_special_tokens`` setting) and raises :class:`Unusable` naming the first text whose ids
differ: whitespace runs, digits, mixed scripts, emoji, combining marks, control characters,
code, every added and special token of the tokenizer inside text, the empty string, and a text
longer than the encoder's slicing limit (256 Ki characters). Encoding that long text whole
with ``tokenizers`` would cost several times what the whole check costs, so it is built as a
block repeated after a joiner, and its expected ids as the block's ids followed by the
repeated tail the joiner and block take in context; that this tiling holds is checked on two
and three blocks first, with a space, a newline and a private-use character as joiners in
turn (a whole-text encode where none tiles). Most of what the check then costs is fastokens's
first pass over a long text, which later passes do not pay; loading costs about as much
again, more with a larger vocabulary (``benchmarks/throughput.py``'s 8k-token vocabulary and
the 128k-token one of ``benchmarks/startup.py``; measured: docs/measurements.md).
"""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import numpy as np

INSTALL = "pip install 'zephon[fast]'"
"""How to install the engine, for messages."""

CHECK_TEXTS: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("whitespace runs", "a  b   c\t\td\n\ne \r\n f" + " " * 17 + "g\n \n  \n\t \u00a0\u3000h   "),
    ("leading and trailing whitespace", "   lead and trail   "),
    ("a lone newline run", "\n\n\n"),
    ("digits", "0 1 12 123 1234 12345 123456789012 3.14159 -42 1,000,000 "
               "2024-01-01T12:30 x1y22z333 \u0661\u0662\u0663 \uff14\uff15\uff16"),
    ("mixed scripts", "Grüße aus Köln, Ελληνικά, русский текст, 中文字符测试, 日本語のテキスト, "
                      "한국어 문장, العربية, עברית, हिन्दी, ไทย, ქართული"),
    ("emoji", "😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 ❤\ufe0f 🇫🇷🇩🇪 ✨🔥💯"),
    ("combining marks", "e\u0301 a\u0308\u0304 n\u0303o Z\u0351\u0360\u0489 "
                        "\u1100\u1161\u11a8 \ufb01 \uff46\uff55\uff4c\uff4c \u212b \u00c5"),
    ("code", "def f(x):\n    return x ** 2  # ok\n\tif a != b: {'k': [1, 2]}\n</div>&amp;"),
    ("contractions", "I'm you're he'll they've we'd it's DON'T Y'ALL"),
    ("control characters", "a\x00b\x07c\x1bd\u200be\u200df\ufeffg\u2028h\ufffd\ue000i"),
)
"""The fixed texts of the self-check (label, text)."""

ADDED_PER_TEXT = 16
"""Added tokens per self-check text (each in five surroundings)."""
ADDED_IN_BLOCK = 16
"""Added tokens (the first and last eight) in the long text's block."""
JOINERS = (" ", "\n", "\ue000")
"""What separates the long text's blocks, tried in turn until the ids tile: a space (byte-level
pre-tokenizers split before it), a newline, and a private-use character that no merge takes
(a barrier for BPE without pre-tokenizer)."""


class Unusable(Exception):
    """Why fastokens cannot encode for a tokenizer: one sentence."""


class Differs(Unusable):
    """fastokens loaded the tokenizer but gave other ids than ``tokenizers`` on a self-check
    text."""


def load(serialized: str) -> Any:
    """A fastokens tokenizer of ``serialized`` (a ``tokenizer.json`` text), with truncation
    and padding off. Raises :class:`Unusable` when the package is missing or refuses the
    tokenizer."""
    try:
        import fastokens
    except ImportError:
        raise Unusable(f"fastokens is not installed ({INSTALL})") from None
    try:
        fast = fastokens.Tokenizer.from_json_str(serialized)
        fast.no_truncation()
        fast.no_padding()
    except BaseException as exc:  # a Rust panic arrives as a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise Unusable(f"fastokens refused to load the tokenizer: {exc}") from None
    return fast


def version() -> str:
    """The installed fastokens version, for the log."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("fastokens")
    except PackageNotFoundError:
        return "?"


def encode(fast: Any, texts: list[str], split_special_tokens: bool,
           bos: int | None = None, eos: int | None = None) -> list[np.ndarray]:
    """Each text's ids as an int32 array (views of one writable copy of the call's buffer),
    each non-empty text's framed by ``bos`` and ``eos`` where given: the framing is done in
    that one copy (``np.insert``), not by a concatenation a text. A text holding a surrogate
    code point raises UnicodeEncodeError."""
    ids, bounds = fast.encode_batch_flat(texts, add_special_tokens=False,
                                         split_special_tokens=split_special_tokens)
    raw = np.frombuffer(ids, dtype="<u4")
    if bos is None and eos is None:
        flat = raw.astype(np.int32)
        ends = np.frombuffer(bounds, dtype="<u8").tolist()
    else:
        flat, ends = _framed(raw, np.frombuffer(bounds, dtype="<u8").astype(np.intp), bos, eos)
    return [flat[start:end] for start, end in pairwise(ends)]


def _framed(raw: np.ndarray, ends: np.ndarray, bos: int | None, eos: int | None
            ) -> tuple[np.ndarray, list[int]]:
    """``raw`` (every text's ids, text ``i`` at ``ends[i]:ends[i + 1]``) as int32 with ``bos``
    before and ``eos`` after each non-empty text, and the texts' new bounds. Where one text's
    EOS and the next one's BOS go at the same place, the EOS comes first (a stable sort in
    ``np.insert``)."""
    starts, stops = ends[:-1], ends[1:]
    kept = stops > starts
    marks = [(where[kept], token) for where, token in ((starts, bos), (stops, eos))
             if token is not None]
    if len(marks) == 1:
        (where, token), = marks
        flat = np.insert(raw.view("<i4"), where, token)
    else:
        where = np.stack([m[0] for m in marks], axis=1).ravel()
        tokens = np.tile(np.array([m[1] for m in marks], dtype=np.int32), kept.sum())
        flat = np.insert(raw.view("<i4"), where, tokens)
    added = np.concatenate([[0], np.cumsum(kept) * len(marks)])
    return flat, (ends + added).tolist()


def self_check(fast: Any, backend: Any, split_special_tokens: bool, long_chars: int
               ) -> tuple[int, float]:
    """(texts compared, seconds taken) when fastokens gives the ids of ``backend`` (a
    ``tokenizers.Tokenizer`` whose ``encode_special_tokens`` is ``split_special_tokens``) for
    every self-check text, one of them over ``long_chars`` characters; raises
    :class:`Unusable` naming the first text that differs."""
    start = time.perf_counter()
    added = [t.content for t in backend.get_added_tokens_decoder().values() if t.content]
    labelled = [*CHECK_TEXTS, *_added_texts(added)]
    expected = [np.asarray(e.ids, dtype=np.int32)
                for e in backend.encode_batch([t for _, t in labelled], add_special_tokens=False)]
    long_text, long_ids = _long_text(backend, _block(added), long_chars)
    labelled.append((f"a text of {len(long_text):,} characters", long_text))
    expected.append(long_ids)
    try:
        got = encode(fast, [t for _, t in labelled], split_special_tokens)
    except BaseException as exc:  # a Rust panic arrives as a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise Unusable(f"fastokens failed on its self-check texts: {exc}") from None
    for index, ((label, _), want, have) in enumerate(zip(labelled, expected, got, strict=True)):
        if not np.array_equal(want, have):
            raise Differs(f"fastokens gave other ids than tokenizers for self-check text "
                           f"{index} ({label}; split_special_tokens={split_special_tokens})")
    return len(labelled), time.perf_counter() - start


def _added_texts(added: list[str]) -> list[tuple[str, str]]:
    """Added and special tokens inside text: alone, glued to letters, between spaces, twice
    in a row, between newlines."""
    out = []
    for at in range(0, len(added), ADDED_PER_TEXT):
        group = added[at:at + ADDED_PER_TEXT]
        text = " ".join(f"{t} x{t}y  {t}  {t}{t}\n{t}\n" for t in group)
        out.append((f"added tokens {at}-{at + len(group) - 1}", text))
    return out


def _block(added: list[str]) -> str:
    """The long text's repeated block: every fixed text and a few added tokens, starting and
    ending with a letter."""
    sample = added[:ADDED_IN_BLOCK // 2] + added[-(ADDED_IN_BLOCK // 2):] if added else []
    return " ".join(["Start", *(t for _, t in CHECK_TEXTS), *(f"x{t}y" for t in sample),
                     "end"])


def _long_text(backend: Any, block: str, long_chars: int) -> tuple[str, np.ndarray]:
    """A text of more than ``long_chars`` characters and its ``tokenizers`` ids: ``block``
    followed by ``(joiner + block)`` repeated, the ids tiled from one block and one tail where
    two and three blocks show that they tile, else encoded whole."""
    def ids(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    head = ids(block)
    for joiner in JOINERS:
        pair = ids(block + joiner + block)
        tail = pair[len(head):]
        if pair[:len(head)] == head and tail and \
                ids(block + (joiner + block) * 2) == head + tail * 2:
            repeats = long_chars // (len(joiner) + len(block)) + 1
            text = block + (joiner + block) * repeats
            return text, np.concatenate([np.asarray(head, dtype=np.int32),
                                         np.tile(np.asarray(tail, dtype=np.int32), repeats)])
    text = block + (" " + block) * (long_chars // (len(block) + 1) + 1)
    return text, np.asarray(ids(text), dtype=np.int32)
