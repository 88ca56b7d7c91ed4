"""Where a long text may be cut so that its slices tokenize to exactly the whole text's ids.

A tokenizer encodes a text in four steps: added tokens are matched, the rest is normalized,
pre-tokenized into words, and each word goes through the model. A cut at position ``c`` is
*safe* when encoding ``text[:c]`` and ``text[c:]`` apart gives the ids of the whole text,
concatenated. :func:`cut_rule` derives from a tokenizer's definition (its ``tokenizer.json``)
whether such cuts exist, and which, by looking at each step:

- **Cuts considered.** Only before a space (or, where the pre-tokenizer splits at it too, a
  newline) whose neighbours on both sides are letters or digits (``str.isalnum``), each left
  unchanged by NFKC and neither a grapheme-joining "prepend" letter. Such a space never joins
  its neighbours in any normalizer listed below: no Unicode composition, no grapheme cluster,
  no run of spaces.
- **Normalizer.** Per-character ones are safe: NFC/NFD/NFKC/NFKD, Lowercase, StripAccents,
  Nmt, BertNormalizer, ByteLevel and SentencePiece's Precompiled map (it maps grapheme by
  grapheme); ``Replace`` when its pattern is a string that holds no space past its first
  character, or a regex that matches only runs of spaces (T5's ``" {2,}"``). ``Prepend``
  (Llama 2's legacy ``"▁"``) prefixes every piece, so the space at a cut is left out of the
  next slice: the prefix stands for it, which holds when the normalizer turns a space into the
  prefix (``Replace(" ", "▁")``). ``Strip`` and anything unknown: no cut.
- **Pre-tokenizer.** The cut is a word boundary under ByteLevel with its regex, Whitespace,
  WhitespaceSplit, BertPreTokenizer, Metaspace with ``split``, CharDelimiterSplit(" "),
  ``Split`` on the string " " (removed, isolated or merged with the next word) and ``Split``
  with a regex known here (GPT-2, Llama 3 / cl100k, o200k, Qwen 2: none lets a word hold a
  space after a letter or digit). Pre-tokenizers that split only where a character itself says
  (Punctuation, Digits), ByteLevel without regex and Metaspace without ``split`` keep the
  words around the cut unchanged but do not make it a boundary. Anything else: no cut.
- **Model.** Across a word boundary every model is safe (each word is encoded alone). Without
  one, the whole text is one word, and only BPE and Unigram can still be cut: when no
  vocabulary token holds the character a space becomes (``"▁"``, ``"Ġ"``, " ") right after
  another character, no merge and no piece can span the cut, so BPE merges each side alone and
  Unigram's best path passes through the cut. BPE with a word prefix or suffix, ``dropout`` or
  ``ignore_merges``, WordPiece and WordLevel: no cut. (Unigram's path scores are sums of
  floats: two segmentations within about 1e-8 of each other could in principle be ranked
  differently whole and sliced; none has been seen.)
- **Added tokens.** No cut falls inside an occurrence of an added token that holds whitespace,
  nor right after one that strips the whitespace following it (``rstrip``).

:func:`self_check` then encodes probe texts whole and cut at every place the rule allows, and
the rule is used only when every id matches: the derivation decides, the check guards it.

Limits: a stretch with no safe cut (text without spaces, as in Chinese or Japanese, or a
minified file) cannot be cut and is encoded whole; so is any text when the tokenizer gives no
rule. :func:`cut_rule` explains why in :attr:`NoCuts.reason`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

KNOWN_SPLIT_REGEXES = {
    "GPT-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "Llama 3 / cl100k": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                         r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "Qwen 2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
               r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "o200k": (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
              r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?"
              r"[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
"""``Split`` regexes whose words never hold a space or newline after a letter or digit (the
pattern text, as tokenizer.json stores it). Each is covered by the differential tests."""

_PER_CHARACTER_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Nmt",
                              "BertNormalizer", "ByteLevel", "Precompiled"}
_SPACE_RUN_REGEX = re.compile(r" +(\{\d*,?\d*\}|[+*?])?")
_BOUNDARY_BEHAVIORS = {"Removed", "Isolated", "MergedWithNext"}
_PREPEND_LETTERS = frozenset("\u0d4e\U000111c2\U000111c3\U0001193f\U00011941\U00011a3a"
                             "\U00011a84\U00011a85\U00011a86\U00011a87\U00011a88\U00011a89"
                             "\U00011d46")
"""Letters of Unicode's grapheme-break class Prepend, which join the character after them
(a space too) into one grapheme cluster."""


class _NoCut(Exception):
    """Raised while deriving: the tokenizer gives no safe cut, for this reason."""


@dataclass(frozen=True)
class NoCuts:
    """A tokenizer whose long texts cannot be cut: ``kind`` describes it, ``reason`` says
    which part of it stops the cut."""

    kind: str
    reason: str


@dataclass(frozen=True)
class CutRule:
    """Where a tokenizer's long texts may be cut (see the module's docstring).

    ``kind`` describes the tokenizer for messages; ``before`` holds the characters a cut comes
    before; with ``drop_space`` the space at a cut is left out of the next slice (the
    normalizer prefixes every piece with what the space becomes) and no cut comes right before
    an added token (the piece it would prefix is empty). ``inside`` holds the added tokens no
    cut may fall inside, ``after`` those no cut may come right after, ``added`` them all."""

    kind: str
    before: str = " "
    drop_space: bool = False
    inside: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chars = "".join(re.escape(c) for c in self.before)
        object.__setattr__(self, "_pattern", re.compile(f"(?<=[^\\W_])[{chars}](?=[^\\W_])"))

    def cut(self, text: str, start: int) -> int | None:
        """The first safe cut at or after ``start``, or None."""
        pattern = self._pattern
        while True:
            found = pattern.search(text, start)
            if found is None:
                return None
            at = found.start()
            if self._allowed(text, at):
                return at
            start = at + 1

    def _allowed(self, text: str, at: int) -> bool:
        for neighbour in (text[at - 1], text[at + 1]):
            if neighbour in _PREPEND_LETTERS or not unicodedata.is_normalized("NFKC", neighbour):
                return False
        for token in self.inside:
            first = text.find(token, max(0, at - len(token) + 1), at + len(token) - 1)
            if 0 <= first < at:
                return False
        if any(text.endswith(token, 0, at) for token in self.after):
            return False
        return not (self.drop_space and any(text.startswith(t, at + 1) for t in self.added))

    def pieces(self, text: str, size: int, limit: int | None = None
               ) -> Iterator[tuple[int, str]]:
        """``text`` as (start, slice) pairs of about ``size`` characters, cut at the first safe
        cut at or after each ``size``; where there is none, the rest is one slice. With
        ``limit``, a slice that would be longer raises :class:`LongStretch` first."""
        start, length = 0, len(text)
        while start < length:
            at = self.cut(text, start + size) if start + size < length else None
            end = length if at is None else at
            if limit is not None and end - start > limit:
                at = self._last_cut(text, start + 1, start + size)
                if at is None:
                    raise LongStretch(start, end - start)
                end = at
            yield start, text[start:end]
            if at is None:
                return
            start = at + 1 if self.drop_space else at

    def _last_cut(self, text: str, start: int, end: int) -> int | None:
        """The last safe cut in ``[start, end)``, or None."""
        last = None
        for found in self._pattern.finditer(text, start, min(end + 1, len(text))):
            at = found.start()
            if at < end and self._allowed(text, at):
                last = at
        return last


class LongStretch(Exception):
    """A stretch of ``length`` characters from ``start`` holds no safe cut."""

    def __init__(self, start: int, length: int):
        super().__init__(start, length)
        self.start, self.length = start, length


def cut_rule(tokenizer_json: str) -> CutRule | NoCuts:
    """The cut rule a tokenizer's definition gives, or why it gives none."""
    spec = json.loads(tokenizer_json)
    kind = describe(spec)
    try:
        prepend, space, newline_kept = _normalizer(spec.get("normalizer"), " ", True)
        at_space, at_newline, space = _pre_tokenizer(spec.get("pre_tokenizer"), space)
        if at_space == NEUTRAL:
            _model_without_boundary(spec.get("model") or {}, space)
    except _NoCut as exc:
        return NoCuts(kind, str(exc))
    if prepend is not None and prepend != space:
        return NoCuts(kind, f"its normalizer prefixes {prepend!r} but turns a space into "
                            f"{space!r}")
    added = spec.get("added_tokens") or []
    newline = newline_kept and at_newline == BOUNDARY and prepend is None
    return CutRule(kind, " \n" if newline else " ", prepend is not None,
                   inside=tuple(sorted({t["content"] for t in added if any(
                       c.isspace() or c == "\u2581" for c in t["content"][1:])})),
                   after=tuple(sorted({t["content"] for t in added if t.get("rstrip")})),
                   added=tuple(sorted({t["content"] for t in added})))


def describe(spec: dict[str, Any]) -> str:
    """A tokenizer's kind in a few words: model, normalizer, pre-tokenizer."""
    model = (spec.get("model") or {}).get("type", "unknown model")
    return (f"{model} (normalizer {_name(spec.get('normalizer'))}, pre-tokenizer "
            f"{_name(spec.get('pre_tokenizer'))})")


def _name(part: dict[str, Any] | None) -> str:
    if part is None:
        return "none"
    members = part.get("normalizers") or part.get("pretokenizers")
    if part.get("type") == "Sequence" and members is not None:
        return "[" + ", ".join(_name(m) for m in members) + "]"
    return str(part.get("type"))


def _normalizer(part: dict[str, Any] | None, space: str, newline_kept: bool
                ) -> tuple[str | None, str, bool]:
    """(the prefix a Prepend adds, or None; what a space has become; whether a newline cut
    still is one) after ``part``."""
    if part is None:
        return None, space, newline_kept
    kind = part.get("type")
    if kind == "Sequence":
        prepend = None
        for member in part.get("normalizers", []):
            added, space, newline_kept = _normalizer(member, space, newline_kept)
            prepend = prepend if added is None else added
        return prepend, space, newline_kept
    if kind in _PER_CHARACTER_NORMALIZERS:
        return None, space, newline_kept
    if kind == "Prepend":
        return part.get("prepend", ""), space, newline_kept
    if kind == "Replace":
        pattern = part.get("pattern") or {}
        if "String" in pattern:
            text = pattern["String"]
            if space in text[1:]:
                raise _NoCut(f"its normalizer replaces {text!r}, which spans a space")
            content = part.get("content", "")
            return None, content if text == space else space, newline_kept and \
                "\n" not in text[1:]
        if _SPACE_RUN_REGEX.fullmatch(pattern.get("Regex", "")):
            return None, space, newline_kept
        raise _NoCut(f"its normalizer replaces the regex {pattern.get('Regex')!r}, whose "
                     "matches may span a cut")
    raise _NoCut(f"its normalizer {kind} may join text across a cut")


BOUNDARY, NEUTRAL, UNSAFE = "boundary", "neutral", "unsafe"
"""What a pre-tokenizer makes of a cut before a character: a word boundary; no boundary, the
words on either side unchanged; or words that may change."""


def _pre_tokenizer(part: dict[str, Any] | None, space: str) -> tuple[str, str, str]:
    """(what a cut before a space is, what one before a newline is, what a space has
    become) after ``part``."""
    if part is None:
        return NEUTRAL, NEUTRAL, space
    kind = part.get("type")
    if kind == "Sequence":
        at_space = at_newline = NEUTRAL
        for member in part.get("pretokenizers", []):
            space_now, newline_now, space = _pre_tokenizer(member, space)
            at_space, at_newline = _joined(at_space, space_now), _joined(at_newline, newline_now)
        return at_space, at_newline, space
    if kind in ("Whitespace", "WhitespaceSplit", "BertPreTokenizer"):
        return _unless_replaced(kind, space, (" ",)), BOUNDARY, space
    if kind == "ByteLevel":
        made = BOUNDARY if part.get("use_regex", True) else NEUTRAL
        made = _unless_replaced(kind, space, (" ",)) if made == BOUNDARY else made
        return made, made, "\u0120" if space == " " else space
    if kind == "Metaspace":
        replacement = part.get("replacement", "\u2581")
        made = _unless_replaced(kind, space, (" ", replacement)) if part.get("split", True) \
            else NEUTRAL
        return made, NEUTRAL, replacement if space == " " else space
    if kind in ("Punctuation", "Digits"):
        return NEUTRAL, NEUTRAL, space
    if kind == "CharDelimiterSplit":
        delimiter = part.get("delimiter")
        return (BOUNDARY if delimiter == space else NEUTRAL,
                BOUNDARY if delimiter == "\n" else NEUTRAL, space)
    if kind == "Split" and not part.get("invert"):
        pattern = part.get("pattern") or {}
        if "String" in pattern:
            text, behavior = pattern["String"], part.get("behavior")
            at_space = _split_at(text, behavior, space)
            if at_space == UNSAFE:
                raise _NoCut(f"its pre-tokenizer Split({text!r}, {behavior}) moves the word "
                             "boundary at a space")
            return at_space, _split_at(text, behavior, "\n"), space
        if space == " " and part.get("behavior") == "Isolated" and \
                pattern.get("Regex") in KNOWN_SPLIT_REGEXES.values():
            return BOUNDARY, BOUNDARY, space
        raise _NoCut(f"its pre-tokenizer splits with a regex ({pattern.get('Regex')!r}) not "
                     "known to keep words from spanning a space")
    raise _NoCut(f"its pre-tokenizer {kind}{' (inverted)' if part.get('invert') else ''} may "
                 "join text across a cut")


def _unless_replaced(kind: str, space: str, splits_at: tuple[str, ...]) -> str:
    """A boundary when the splitter still meets a space as one of ``splits_at``."""
    if space not in splits_at:
        raise _NoCut(f"its pre-tokenizer {kind} meets spaces its normalizer turned into "
                     f"{space!r}")
    return BOUNDARY


def _split_at(text: str, behavior: Any, char: str) -> str:
    """What ``Split`` on the string ``text`` makes of a cut before ``char``."""
    if char not in text:
        return NEUTRAL  # no match can hold the cut's character: the words around it stay
    return BOUNDARY if text == char and behavior in _BOUNDARY_BEHAVIORS else UNSAFE


def _joined(before: str, member: str) -> str:
    if UNSAFE in (before, member):
        return UNSAFE
    return BOUNDARY if BOUNDARY in (before, member) else NEUTRAL


def _model_without_boundary(model: dict[str, Any], space: str) -> None:
    """Raise :class:`_NoCut` unless the model encodes one word cut before ``space`` as the
    two sides apart (see the module's docstring)."""
    kind = model.get("type")
    if kind == "BPE":
        for option in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
            if model.get(option):
                raise _NoCut(f"its BPE model has no word boundary at a space and sets {option}")
        if model.get("ignore_merges"):
            raise _NoCut("its BPE model has no word boundary at a space and sets ignore_merges")
        tokens = model.get("vocab") or {}
    elif kind == "Unigram":
        tokens = [piece for piece, _score in model.get("vocab") or []]
    else:
        raise _NoCut(f"its pre-tokenizer makes no word boundary at a space, which a {kind} "
                     "model needs")
    if space not in tokens:
        raise _NoCut(f"its vocabulary has no token {space!r} for a space")
    for token in tokens:
        at = token.find(space, 1)
        while at > 0:
            if token[at - 1] != space:
                raise _NoCut(f"its pre-tokenizer makes no word boundary at a space, and the "
                             f"vocabulary token {token!r} spans one")
            at = token.find(space, at + 1)


def self_check(rule: CutRule, encode: Callable[[list[str]], list[list[int]]],
               added: list[str]) -> str | None:
    """Encode probe texts whole and cut at every place ``rule`` allows; None when the ids
    match, else a description of the first text that differs. ``added`` are the added
    tokens' contents, placed at and next to cuts."""
    for text in probe_texts(added):
        whole = encode([text])[0]
        slices = [piece for _start, piece in rule.pieces(text, 1)]
        sliced = [i for ids in encode(slices) for i in ids]
        if list(whole) != sliced:
            return (f"the slices of a {len(text)}-character probe text ({text[:40]!r}...) do not "
                    "encode to the whole text's ids")
    return None


def probe_texts(added: list[str]) -> list[str]:
    """Texts with cuts next to what may join across them: whitespace runs, newlines, digits,
    punctuation, letters of several scripts, combining marks, emoji and added tokens."""
    words = ["the", "Quick", "brown", "fox", "42", "x7", "naïve", "Köln", "Ελλάδα", "слово",
             "日本語", "한국어", "e\u0301t\u00e9", "a\u0308", "ﬁne", "½", "Ⅻ", "İstanbul", "ß"]
    glue = [" ", " ", "  ", "\n", " \n", "\t", ", ", ". ", "   ", " - ", "\n\n", "😀 "]
    out = []
    for seed in range(3):
        parts = []
        for i in range(160):
            parts.append(words[(i * 7 + seed) % len(words)])
            parts.append(glue[(i * 5 + seed * 3) % len(glue)])
            if added and i % 9 == seed:
                token = added[(i // 9) % len(added)]
                parts.append([token, f" {token}", f"{token} ", f"a{token}b"][i % 4])
        out.append("".join(parts))
    return out
