"""The fast tokenizer engine (fastokens): the same ids as tokenizers on every tokenizer shape we
test, a self-check before it is used, and tokenizers where it cannot be."""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import pickle
import random
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import zephon.text.fast_engine as fast_engine
import zephon.text.tokenizer as tokenizer_module
from zephon.errors import ConfigError
from zephon.ops.tokenize import DocumentTokenizer, TokenizeSpec
from zephon.text.tokenizer import TextEncoder, load_tokenizer

LOGGER = "zephon.text.tokenizer"
needs_fastokens = pytest.mark.skipif(importlib.util.find_spec("fastokens") is None,
                                     reason="fastokens is not installed (the fast extra)")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus() -> list[str]:
    """Pseudo-English documents, Python source and a few scripts: what the shapes train on."""
    from zephon.demo.assets import make_documents

    code = [inspect.getsource(textwrap), inspect.getsource(json.decoder)]
    scripts = ["Grüße aus Köln und Zürich. Ελληνικά κείμενα. Русский текст здесь.",
               "中文字符测试，日本語のテキスト。한국어 문장입니다. 12345 67 8.9"]
    return [*make_documents(120, seed=11), *code, *scripts * 20]


def added_tokens() -> list:
    """Non-special added tokens with each matching flag, as real tokenizers carry them."""
    from tokenizers import AddedToken

    return [AddedToken("<tool_call>", special=False),
            AddedToken("</tool_call>", special=False, normalized=False),
            AddedToken("[MASK]", lstrip=True, special=False),
            AddedToken("<sep>", rstrip=True, special=False),
            AddedToken("indeed", single_word=True, special=False)]


def byte_level(path: Path, llama3: bool) -> Path:
    """A byte-level BPE: GPT-2's pre-tokenizer, or Llama 3's split regex then byte mapping."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if llama3:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>", "<|pad|>"]
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_tokens(added_tokens())
    tokenizer.save(str(path))
    return path


def sentencepiece_bpe(path: Path) -> Path:
    """A SentencePiece-style BPE as Llama 2's tokenizer.json has it: a normalizer that prefixes
    and replaces spaces with '▁', no pre-tokenizer, byte fallback through <0xNN> tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # words for training only
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    base = max(vocab.values()) + 1
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = base + byte
    spec["pre_tokenizer"] = None
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "},
                                              "content": "▁"}]}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.add_tokens(added_tokens())
    tokenizer.save(str(path))
    return path


SHAPES = {"gpt2": lambda p: byte_level(p, llama3=False),
          "llama3": lambda p: byte_level(p, llama3=True),
          "sentencepiece": sentencepiece_bpe}


@pytest.fixture(autouse=True)
def fresh_process_cache(monkeypatch):
    """Each test sees fastokens as a fresh process does: not yet loaded for any tokenizer."""
    monkeypatch.setattr(tokenizer_module, "_FAST", {})


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {name: build(root / f"{name}.json") for name, build in SHAPES.items()}


def backend(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


BLOCKS = [(0x21, 0x7E), (0xA1, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
          (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x10A0, 0x10FF),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x4FFF),
          (0xAC00, 0xAD00), (0xE000, 0xE0FF), (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF),
          (0x1F300, 0x1FAFF), (0x0, 0x1F)]
WHITESPACE = " \t\n\r\u00a0\u2009\u3000\u200b"
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🏳\ufe0f\u200d🌈", "🇫🇷", "❤\ufe0f"]


def fuzzed(seed: int, n: int, added: list[str]) -> list[str]:
    """Seeded random texts: runs of code points from many Unicode blocks (combining marks,
    controls and private use included), whitespace runs, digits, emoji sequences, ASCII words
    and added-token strings, whole or glued to their neighbours."""
    rng = random.Random(seed)

    def piece() -> str:
        kind = rng.random()
        if kind < 0.35:
            low, high = rng.choice(BLOCKS)
            return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 8)))
        if kind < 0.55:
            return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 6)))
        if kind < 0.65:
            return str(rng.randint(0, 10 ** rng.randint(1, 12)))
        if kind < 0.72:
            return rng.choice(EMOJI)
        if kind < 0.85:
            return rng.choice(added)
        return rng.choice(["the", "The", " of", "don't", "I'll", "x", "tokens", "ing"])

    return ["".join(piece() for _ in range(rng.randint(0, 60))) for _ in range(n)]


@needs_fastokens
def test_the_engine_is_a_recipe_key_outside_the_fingerprint(tokenizer_dir):
    from zephon.recipe import recipe_schema

    assert recipe_schema()["tokenize"]["engine"].default == "auto"
    hf = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="hf"))
    fast = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="fastokens"))
    assert hf.encoder.engine == "tokenizers" and fast.encoder.engine == "fastokens"
    assert hf.fingerprint() == fast.fingerprint()
    with pytest.raises(ConfigError, match=r"tokenize: engine must be one of 'auto', 'hf', "
                                          r"'fastokens', got 'rust'"):
        TokenizeSpec(tokenizer_id=tokenizer_dir, engine="rust")


@needs_fastokens
def test_auto_switches_to_fastokens_after_its_self_check_and_says_so(tokenizer_dir, caplog):
    from zephon.demo.assets import make_documents

    texts = [*make_documents(30, seed=4), "", "<|eos|> in text"]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
        assert op.encoder.engine == "fastokens" and op.encoder.engine_note is None
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "encodes with fastokens" in line and "self-check texts" in line
    hf = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="hf"))
    got, expected = op.encode(texts), hf.encode(texts)
    assert [[p.tolist() for p in d] for d in got] == [[p.tolist() for p in d] for d in expected]
    assert all(p.dtype == np.int32 and p.flags.writeable for d in got for p in d)


@needs_fastokens
def test_auto_prepares_fastokens_from_the_first_call_and_later_calls_wait(tokenizer_dir,
                                                                           monkeypatch):
    """Nothing is loaded as the encoder is built; the first call starts the preparation and
    encodes with tokenizers meanwhile; the next call waits for it, at the caller's priority.
    Sent to a worker process meanwhile, the encoder makes its own check there; once fastokens
    encodes, only the load."""
    from zephon.demo.assets import make_documents

    priorities = []
    started = tokenizer_module._Preparation._run

    def run(self):
        priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        started(self)

    monkeypatch.setattr(tokenizer_module._Preparation, "_run", run)
    texts = make_documents(20, seed=8)
    expected = [ids.tolist() for ids in TextEncoder(load_tokenizer(tokenizer_dir)).encode(texts)]
    encoder = TextEncoder(load_tokenizer(tokenizer_dir), engine="auto")
    preparing = encoder._preparing
    assert preparing is not None and not preparing._started
    assert pickle.loads(pickle.dumps(encoder))._preparing.check  # pending: checked there
    assert [ids.tolist() for ids in encoder.encode(texts)] == expected
    assert preparing._started and not preparing.first_call
    assert [ids.tolist() for ids in encoder.encode(texts)] == expected
    assert encoder._fast is not None and encoder._preparing is None  # the call waited
    assert priorities == [os.getpriority(os.PRIO_PROCESS, 0)]
    monkeypatch.setattr(tokenizer_module, "_FAST", {})  # as in a worker process
    assert not pickle.loads(pickle.dumps(encoder))._preparing.check  # loaded only


@needs_fastokens
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("split", [True, False])
def test_both_engines_agree_on_a_corpus_and_fuzzed_unicode(shapes, shape, split, caplog):
    """Differential: every shape loads in fastokens, passes the self-check (auto picks it) and
    gives the tokenizers ids on the training corpus and 400 fuzzed texts, with special-token
    text split or kept."""
    tokenizer = backend(shapes[shape])
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    texts = [*corpus(), *fuzzed(seed=len(shape) * 7 + split, n=400, added=added)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        auto = TextEncoder(tokenizer, split_special_tokens=split, engine="auto")
        assert auto.engine == "fastokens", auto.engine_note
    hf = TextEncoder(tokenizer, split_special_tokens=split)
    fast = TextEncoder(tokenizer, split_special_tokens=split, engine="fastokens")
    expected = [ids.tolist() for ids in hf.encode(texts)]
    assert [ids.tolist() for ids in fast.encode(texts)] == expected
    assert [ids.tolist() for ids in auto.encode(texts)] == expected
    specials = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    assert bool(specials & {i for ids in expected for i in ids}) is not split


@needs_fastokens
@pytest.mark.parametrize("bos, eos", [(None, 7), (5, None), (5, 7), (7, 7)])
def test_both_engines_frame_documents_with_bos_and_eos_alike(shapes, bos, eos):
    """BOS and EOS are framed inside fastokens's one buffer a call (``np.insert``) and by a
    concatenation a text on the tokenizers path: the same ids, empty texts staying empty
    (among them adjacent empties, and an empty first and last text), and each text's array
    writable and its own."""
    tokenizer = backend(shapes["gpt2"])
    texts = ["", "", *corpus()[:40], "", "a", "", *fuzzed(seed=3, n=60, added=["<|eos|>"]), ""]
    plain = [ids.tolist() for ids in TextEncoder(tokenizer).encode(texts)]
    expected = [[*([bos] if bos is not None else []), *ids, *([eos] if eos is not None else [])]
                if ids else [] for ids in plain]
    for engine in ("hf", "fastokens"):
        encoder = TextEncoder(tokenizer, engine=engine)
        framed = encoder.encode(texts, bos, eos)
        assert [ids.tolist() for ids in framed] == expected, engine
        assert all(ids.dtype == np.int32 and ids.flags.writeable for ids in framed)
        framed[2][:] = -1
        assert framed[3].tolist() == expected[3]  # no overlap with the next text's ids


def refused(kind: str, path: Path) -> object:
    """Tokenizers fastokens does not load: an NFKC normalizer, a Metaspace pre-tokenizer, a
    Unigram model."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    if kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # words for training only
        tokenizer.train_from_iterator(corpus(), trainers.UnigramTrainer(
            vocab_size=300, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False))
        spec = json.loads(tokenizer.to_str())
        spec["pre_tokenizer"] = None
        spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        return Tokenizer.from_str(json.dumps(spec))
    tokenizer = backend(byte_level(path, llama3=False))
    if kind == "nfkc":
        tokenizer.normalizer = normalizers.NFKC()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    return tokenizer


@needs_fastokens
@pytest.mark.parametrize("kind, why", [("nfkc", "NFKC"), ("metaspace", "Metaspace"),
                                       ("unigram", "Unigram")])
def test_tokenizers_fastokens_refuses_fall_back_saying_why(kind, why, tmp_path, caplog):
    tokenizer = refused(kind, tmp_path / "t.json")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        auto = TextEncoder(tokenizer, engine="auto")
        assert auto.engine == "tokenizers"
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "encodes with tokenizers, not fastokens: fastokens refused to load" in line
    assert auto.engine_note is not None and auto.engine_note in line
    texts = corpus()[:20]
    expected = [ids.tolist() for ids in TextEncoder(tokenizer).encode(texts)]
    assert [ids.tolist() for ids in auto.encode(texts)] == expected
    with pytest.raises(ConfigError, match=f"engine='fastokens' cannot be used: fastokens "
                                          f"refused to load the tokenizer: .*({why})"):
        TextEncoder(tokenizer, engine="fastokens")


def test_without_fastokens_installed_auto_falls_back_with_one_line(tokenizer_dir, monkeypatch,
                                                                   caplog):
    monkeypatch.setitem(sys.modules, "fastokens", None)  # its import now fails
    with caplog.at_level(logging.INFO, logger=LOGGER):
        op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
        assert op.encoder.engine == "tokenizers"
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert line.endswith("not fastokens: fastokens is not installed (pip install "
                         "'zephon[fast]')")
    hf = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="hf"))
    assert op.encode(["Ka lo mi."])[0][0].tolist() == hf.encode(["Ka lo mi."])[0][0].tolist()
    with pytest.raises(ConfigError, match=r"engine='fastokens' cannot be used: fastokens is "
                                          r"not installed \(pip install 'zephon\[fast\]'\)"):
        DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="fastokens"))


class Skewed:
    """A fastokens tokenizer whose ids are off by one for texts holding an emoji."""

    def __init__(self, real):
        self.real = real

    def encode_batch_flat(self, texts, **options):
        ids, bounds = self.real.encode_batch_flat(texts, **options)
        flat = np.frombuffer(ids, dtype="<u4").copy()
        ends = np.frombuffer(bounds, dtype="<u8")
        for i, text in enumerate(texts):
            if "😀" in text and ends[i + 1] > ends[i]:
                flat[ends[i]] += 1
        return flat.tobytes(), bounds


@needs_fastokens
def test_a_self_check_difference_falls_back_and_names_the_text(tokenizer_dir, monkeypatch,
                                                                 caplog):
    real_load = fast_engine.load
    monkeypatch.setattr(fast_engine, "load", lambda serialized: Skewed(real_load(serialized)))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
        assert op.encoder.engine == "tokenizers"
    [record] = [r for r in caplog.records if r.name == LOGGER]
    index = [label for label, _ in fast_engine.CHECK_TEXTS].index("emoji")
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(
        f"not fastokens: fastokens gave other ids than tokenizers for self-check text {index} "
        "(emoji; split_special_tokens=True)")
    with pytest.raises(ConfigError, match=f"self-check text {index} \\(emoji"):
        DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="fastokens"))


@needs_fastokens
def test_the_self_check_covers_a_long_text_without_encoding_it_whole(shapes):
    """The long text (over the slicing limit) gets its tokenizers ids by tiling: that engine
    encodes a few blocks, not the 256 Ki characters, yet the tiled ids are the whole text's."""
    for shape in SHAPES:
        tokenizer = backend(shapes[shape])
        for split in (True, False):
            tokenizer.encode_special_tokens = split
            added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
            block = fast_engine._block(added)
            text, ids = fast_engine._long_text(Counting(tokenizer), block, 1 << 18)
            assert len(text) > 1 << 18
            assert ids.tolist() == tokenizer.encode(text, add_special_tokens=False).ids
            assert Counting.chars < 10 * len(block), (shape, split)
            Counting.chars = 0
            labels = [label for label, _ in fast_engine.CHECK_TEXTS]
            assert all(t in block for t in added[:8] + added[-8:])
            assert {"whitespace runs", "digits", "mixed scripts", "emoji", "combining marks",
                    "empty"} <= set(labels)


class Counting:
    """A tokenizers backend that counts the characters it encodes."""

    chars = 0

    def __init__(self, real):
        self.real = real

    def encode(self, text, **options):
        Counting.chars += len(text)
        return self.real.encode(text, **options)


@needs_fastokens
def test_every_path_gives_the_same_ids_with_the_fast_engine(tokenizer_dir, monkeypatch):
    """Batch calls, long-text slices, max_document_tokens pieces made lazily, an encoder sent
    to a worker process (rebuilt there), special-token text split or kept."""
    import zephon.ops.tokenize as tokenize_module
    from tests.kit.texts import long_text
    from zephon.ops.base import LazyPieces
    from zephon.records import Doc
    from zephon.text.tokenizer import POOL_TURNS

    text = long_text(3000) + " <|eos|> x<|bos|>y"
    for split in (True, False):
        spec = dict(tokenizer_id=tokenizer_dir, split_special_tokens=split,
                    max_document_tokens=64)
        hf = DocumentTokenizer(TokenizeSpec(**spec, engine="hf"))
        fast = DocumentTokenizer(TokenizeSpec(**spec, engine="fastokens"))
        [expected] = hf.encode([text])
        started = POOL_TURNS.started
        assert [p.tolist() for p in fast.encode([text] * 20)[7]] == [p.tolist() for p in expected]
        assert POOL_TURNS.started == started  # fastokens calls do not take pool turns
        travelled = pickle.loads(pickle.dumps(fast.encoder))
        assert travelled.engine == "fastokens"
        assert travelled.encode([text])[0].tolist() == np.concatenate(expected)[1:-1].tolist()
        with monkeypatch.context() as patch:
            patch.setattr(tokenize_module, "LONG_TEXT_CHARS", 1000)
            patch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 1000)
            patch.setattr(tokenizer_module, "SLICE_CHARS", 333)
            assert len(list(fast.encoder.slices(text))) > 20
            [lazy] = fast.apply([Doc(None, "d", "web", fields={"text": text})], ["row 0"])
            assert isinstance(lazy, LazyPieces)
            assert [p.tokens.tolist() for p in lazy] == [p.tolist() for p in expected]


@needs_fastokens
def test_a_saved_truncation_setting_never_cuts_documents_in_fastokens(tmp_path):
    from zephon.demo.assets import make_documents, train_tokenizer

    path = Path(train_tokenizer(make_documents(30, seed=5), tmp_path / "t", vocab_size=400))
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 5, "strategy": "LongestFirst",
                          "stride": 0}
    (path / "tokenizer.json").write_text(json.dumps(spec))
    text = make_documents(1, seed=9, min_words=200, max_words=200)[0]
    fast = TextEncoder(load_tokenizer(str(path)), engine="fastokens")
    assert fast.engine == "fastokens"
    assert fast.encode([text])[0].tolist() == TextEncoder(load_tokenizer(str(path))).encode(
        [text])[0].tolist()
    assert fast.encode([text])[0].size > 100


@needs_fastokens
def test_a_lone_surrogate_is_named_with_the_fast_engine(tokenizer_dir):
    from zephon.errors import DataError
    from zephon.records import Doc

    op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, engine="fastokens"))
    texts = ["Ka lo.", "x \udc80 y", "Mi ne."]
    docs = [Doc(None, f"d{i}", "web", fields={"text": t}) for i, t in enumerate(texts)]
    with pytest.raises(DataError, match=r"web/part-0\.jsonl:2: field 'text', character 2, "
                                        r"holds the surrogate code point U\+DC80"):
        op.apply(docs, [f"web/part-0.jsonl:{i + 1}" for i in range(3)])


def test_a_python_tokenizer_keeps_its_own_engine_under_auto(caplog):
    from transformers import ByT5Tokenizer

    with caplog.at_level(logging.INFO, logger=LOGGER):
        encoder = TextEncoder(ByT5Tokenizer(), engine="auto")
        assert encoder.engine == "transformers"
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "ByT5Tokenizer has no Rust backend (tokenizer.json) for fastokens to read" in line
    with pytest.raises(ConfigError, match="ByT5Tokenizer has no Rust backend"):
        TextEncoder(ByT5Tokenizer(), engine="fastokens")


@needs_fastokens
def test_a_process_forked_while_fastokens_was_prepared_prepares_it_again(tokenizer_dir):
    """A forked child has the encoder but not the thread preparing fastokens: it starts its
    own instead of waiting for one that does not exist."""
    from zephon.text.tokenizer import _Preparation

    encoder = TextEncoder(load_tokenizer(tokenizer_dir), engine="auto")
    assert encoder.engine == "fastokens"
    orphan = _Preparation(encoder, None, check=True, announce=False)
    orphan.start = lambda: None  # never runs here: as if started in the parent
    orphan.pid = -1
    encoder._fast, encoder._preparing = None, orphan
    assert encoder.encode(["Ka lo."])[0].size > 0  # tokenizers meanwhile
    assert encoder._preparing is not orphan
    assert encoder.engine == "fastokens"


def test_chat_stays_on_tokenizers_for_its_offsets(tmp_path, caplog):
    from zephon.demo.assets import build_chat_assets
    from zephon.ops.tokenize_chat import ChatTokenizer, TokenizeChatSpec

    path = build_chat_assets(tmp_path, n=10)["tokenizer"]
    with caplog.at_level(logging.INFO, logger="zephon"):
        chat = ChatTokenizer(TokenizeChatSpec(tokenizer_id=path))
    assert chat.encoder.engine == "tokenizers"
    said = [r.getMessage() for r in caplog.records if "tokenize_chat" in r.getMessage()]
    assert said == ["zephon: tokenize_chat encodes with tokenizers, not fastokens: its "
                    "assistant masks need character offsets, which fastokens does not give"]


def write_corpus(root: Path) -> Path:
    from tests.conftest import write_jsonl
    from zephon.demo.assets import make_documents

    texts = make_documents(80, seed=21, min_words=20, max_words=120)
    texts[5] = texts[5] + " <|eos|> 😀 \u00a0 12345"
    return write_jsonl(root / "web.jsonl", [{"text": t} for t in texts])


def pipeline(path: Path, tokenizer_dir: str, engine: str, **options):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("web", path)], shuffle_rows=False)
    return (Pipeline(source).options(**options)
            .tokenize(tokenizer_id=tokenizer_dir, engine=engine, max_document_tokens=300)
            .pack_flat(65).batch(2))


def rows(batches) -> list[list[int]]:
    return [r.payload["input_ids"].tolist() for b in batches for r in b.records]


@needs_fastokens
def test_a_run_saved_with_one_engine_resumes_exactly_with_the_other(tokenizer_dir, tmp_path):
    path = write_corpus(tmp_path)
    straight = rows(pipeline(path, tokenizer_dir, "hf", prefetch=0))
    assert len(straight) > 40
    for saved, resumed_with in (("hf", "fastokens"), ("fastokens", "hf")):
        for cut in (3, 11):
            run = pipeline(path, tokenizer_dir, saved)
            iterator = iter(run)
            head = rows(next(iterator) for _ in range(cut))
            resumed = pipeline(path, tokenizer_dir, resumed_with)
            resumed.load_state_dict(run.state_dict())
            assert head + rows(resumed) == straight, (saved, cut)


@needs_fastokens
def test_the_fast_engine_in_document_threads_and_worker_processes(tokenizer_dir, tmp_path):
    path = write_corpus(tmp_path)
    straight = rows(pipeline(path, tokenizer_dir, "hf", prefetch=0))
    for options in ({"prefetch": 0}, {}, {"workers": 1}):
        assert rows(pipeline(path, tokenizer_dir, "fastokens", **options)) == straight, options


@needs_fastokens
def test_batches_leave_the_document_threads_once_fastokens_encodes(tokenizer_dir, tmp_path,
                                                                   monkeypatch):
    """tokenizers' calls run on the document threads; fastokens' on the source's own thread,
    where they take no turns at the GIL with the training loop. Under auto the batches move
    when fastokens takes over, mid-stream, and the tokens stay the same."""
    from zephon.engine.document_threads import DocumentThreads

    sent: list[int] = []
    submit = DocumentThreads.submit

    def counted(self, dataset, docs, labels):
        sent.append(len(docs))
        return submit(self, dataset, docs, labels)

    monkeypatch.setattr(DocumentThreads, "submit", counted)
    path = write_corpus(tmp_path)
    straight = rows(pipeline(path, tokenizer_dir, "hf", prefetch=0))
    counts = {}
    for engine in ("hf", "fastokens", "auto"):
        sent.clear()
        monkeypatch.setattr(tokenizer_module, "_FAST", {})  # each as in a fresh process
        assert rows(pipeline(path, tokenizer_dir, engine)) == straight, engine
        counts[engine] = len(sent)
    assert counts["fastokens"] == 0
    assert 0 < counts["auto"] < counts["hf"], counts


@needs_fastokens
def test_fastokens_is_loaded_once_per_process_and_tokenizer(tokenizer_dir, monkeypatch):
    """A second encoder of the same tokenizer and setting shares the checked engine at once
    (no preparation, no load); another split_special_tokens setting is checked apart."""
    loads = []
    real = fast_engine.load
    monkeypatch.setattr(fast_engine, "load", lambda text: loads.append(1) or real(text))
    first = TextEncoder(load_tokenizer(tokenizer_dir), engine="fastokens")
    second = TextEncoder(load_tokenizer(tokenizer_dir), engine="auto")
    assert second._preparing is None and second._fast is first._fast and len(loads) == 1
    other = TextEncoder(load_tokenizer(tokenizer_dir), split_special_tokens=True,
                        engine="fastokens")
    assert other._fast is not first._fast and len(loads) == 2
