"""Small tokenizers of every kind ``tokenize`` meets, trained here, for tests and benchmarks.

Each kind is built the way its family's ``tokenizer.json`` is: the same model, normalizer and
pre-tokenizer, with a vocabulary of about 1,000 tokens trained on the demo corpus plus a few
scripts (under a second each). Every directory loads as a ``tokenizer_id`` (its
``tokenizer_config.json`` names ``<s>`` and ``</s>``) and carries non-special added tokens with
each matching flag, one of them holding a space.

========================  ===========  ==================================  =====================
kind                      model        normalizer                          pre-tokenizer
========================  ===========  ==================================  =====================
``byte_level``            BPE          none                                ByteLevel (GPT-2)
``llama3``                BPE          none                                Split(Llama 3 regex),
                                                                           ByteLevel
``wordlevel_whitespace``  WordLevel    none                                Whitespace
``wordlevel_split``       WordLevel    none                                WhitespaceSplit
``metaspace_bpe``         BPE          none                                Metaspace (split)
``llama2``                BPE, bytes   none                                Metaspace (first,
                                                                           no split)
``sentencepiece_bpe``     BPE, bytes   Prepend("▁"), Replace(" ", "▁")     none
``unigram``               Unigram      Precompiled (NFKC), Replace(" +")   WhitespaceSplit,
                                                                           Metaspace
``wordpiece``             WordPiece    BertNormalizer                      BertPreTokenizer
========================  ===========  ==================================  =====================

``llama2`` is what transformers builds for Llama 2 and Mistral today, ``sentencepiece_bpe``
their older (``legacy``) files, ``unigram`` T5's: its Precompiled map comes from a SentencePiece
model trained with ``nmt_nfkc`` when the ``sentencepiece`` package is installed, and is NFKC
otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
SCRIPTS = ["Grüße aus Köln und Zürich. Ελληνικά κείμενα εδώ. Русский текст здесь.",
           "中文字符测试，日本語のテキスト。한국어 문장입니다. 12345 67 8.9 naïve café ﬁne"]
VOCAB_SIZE = 1000


def corpus() -> list[str]:
    """The demo corpus's first 300 documents and a few scripts."""
    from zephon.demo.assets import make_documents

    return [*make_documents(300, seed=11), *SCRIPTS * 30]


def added_tokens() -> list[Any]:
    """Non-special added tokens with each matching flag, as real tokenizers carry them."""
    from tokenizers import AddedToken

    return [AddedToken("<tool_call>", special=False),
            AddedToken("</tool_call>", special=False, normalized=False),
            AddedToken("[MASK]", lstrip=True, special=False),
            AddedToken("<sep>", rstrip=True, special=False),
            AddedToken("indeed", single_word=True, special=False),
            AddedToken("new york", special=False)]


def _byte_level(llama3: bool) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from zephon.text.long_text import KNOWN_SPLIT_REGEXES

    tokenizer = Tokenizer(models.BPE())
    if llama3:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(KNOWN_SPLIT_REGEXES["Llama 3 / cl100k"]),
                                 behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def _word_level(split: bool) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit() if split \
        else pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus(), trainers.WordLevelTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False))
    return tokenizer


def _metaspace_bpe(byte_fallback: bool) -> Any:
    """A BPE trained on Metaspace words (so no token spans a word start), with <0xNN> byte
    tokens when ``byte_fallback``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback,
                                     fuse_unk=byte_fallback))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)])
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False))
    if not byte_fallback:
        return tokenizer
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    base = max(vocab.values()) + 1
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = base + byte
    return Tokenizer.from_str(json.dumps(spec))


def _with(tokenizer: Any, **parts: Any) -> Any:
    """``tokenizer`` with the given top-level parts of its JSON replaced."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.to_str())
    spec.update(parts)
    return Tokenizer.from_str(json.dumps(spec))


def _llama2() -> Any:
    return _with(_metaspace_bpe(byte_fallback=True), pre_tokenizer={
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False})


def _sentencepiece_bpe() -> Any:
    return _with(_metaspace_bpe(byte_fallback=True), pre_tokenizer=None, normalizer={
        "type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})


def _unigram() -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    pieces, charsmap = _sentencepiece_unigram()
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    first = normalizers.Precompiled(charsmap) if charsmap else normalizers.NFKC()
    tokenizer.normalizer = normalizers.Sequence([first, normalizers.Replace(Regex(" {2,}"),
                                                                            " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always",
                                           split=True)
    return tokenizer


def _sentencepiece_unigram() -> tuple[list[tuple[str, float]], bytes | None]:
    """(pieces with scores, precompiled normalization map) of a Unigram model: trained by
    SentencePiece with ``nmt_nfkc`` where it is installed, else by ``tokenizers``."""
    import tempfile

    try:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as model_pb2
    except ImportError:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        trained = Tokenizer(models.Unigram())
        trained.pre_tokenizer = pre_tokenizers.Metaspace()
        trained.train_from_iterator(corpus(), trainers.UnigramTrainer(
            vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, unk_token="<unk>",
            show_progress=False))
        return [tuple(p) for p in json.loads(trained.to_str())["model"]["vocab"]], None
    with tempfile.TemporaryDirectory() as scratch:
        text = Path(scratch, "corpus.txt")
        text.write_text("\n".join(line for doc in corpus() for line in doc.split(". ")))
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(Path(scratch, "m")), vocab_size=VOCAB_SIZE,
            model_type="unigram", normalization_rule_name="nmt_nfkc", unk_id=0, bos_id=1,
            eos_id=2, pad_id=3, character_coverage=1.0, minloglevel=2)
        proto = model_pb2.ModelProto()
        proto.ParseFromString(Path(scratch, "m.model").read_bytes())
    pieces = [(SPECIALS[i] if i < len(SPECIALS) else p.piece, p.score)
              for i, p in enumerate(proto.pieces)]
    return pieces, proto.normalizer_spec.precompiled_charsmap


def _wordpiece() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(corpus(), trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False))
    return tokenizer


KINDS: dict[str, Callable[[], Any]] = {
    "byte_level": lambda: _byte_level(llama3=False),
    "llama3": lambda: _byte_level(llama3=True),
    "wordlevel_whitespace": lambda: _word_level(split=False),
    "wordlevel_split": lambda: _word_level(split=True),
    "metaspace_bpe": lambda: _metaspace_bpe(byte_fallback=False),
    "llama2": _llama2,
    "sentencepiece_bpe": _sentencepiece_bpe,
    "unigram": _unigram,
    "wordpiece": _wordpiece,
}
"""Each kind's builder (see the module's docstring)."""


def build_tokenizer(kind: str, directory: str | os.PathLike[str], added: bool = True) -> str:
    """Train the tokenizer of ``kind`` and save it as a tokenizer directory (with the added
    tokens of :func:`added_tokens` when ``added``); returns the directory."""
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; known: {', '.join(KINDS)}")
    tokenizer = KINDS[kind]()
    if added:
        tokenizer.add_tokens(added_tokens())
    tokenizer.add_special_tokens(SPECIALS)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>"}))
    return str(out)
