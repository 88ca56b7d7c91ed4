"""Long texts cut into slices for every kind of tokenizer, with the whole text's ids; the cut
rules derived from tokenizer definitions; long texts that cannot be cut refused by name."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

import zephon.text.long_text as long_text
import zephon.text.tokenizer as tokenizer_module
from zephon.demo.tokenizer_kinds import KINDS, added_tokens, build_tokenizer
from zephon.errors import ConfigError, DataError
from zephon.text.long_text import CutRule, NoCuts, cut_rule
from zephon.text.tokenizer import TextEncoder, load_tokenizer

ADDED = [t.content for t in added_tokens()] + ["<s>", "</s>"]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("kinds")
    return {kind: build_tokenizer(kind, root / kind) for kind in KINDS}


def hard_text(seed: int, words: int) -> str:
    """Words of several scripts glued by single spaces (where cuts go), runs of spaces,
    newlines and tabs, with added and special tokens at, next to and across the places cuts
    can go, and a few random code points."""
    from zephon.demo.assets import make_documents

    rng = random.Random(seed)
    plain = " ".join(make_documents(20, seed=seed)).split(" ")
    scripts = ["Köln", "Ελλάδα", "слово", "日本語", "한국어", "naïve", "e\u0301", "ﬁ", "½", "x7",
               "42", "İ", "ß", "😀", "\u0d4eka"]
    glue = [" "] * 12 + ["  ", "     ", "\n", " \n", "\n\n", "\t", " \t ", ". ", ", ", " - ",
                         " " * 40, "\u3000", "\u00a0"]
    parts = []
    for _ in range(words):
        roll = rng.random()
        if roll < 0.08:
            token = rng.choice(ADDED)
            parts.append(rng.choice([token, f" {token}", f"{token} ", f"a{token}", f"{token}b"]))
        elif roll < 0.2:
            parts.append(rng.choice(scripts))
        elif roll < 0.22:
            parts.append("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(3)))
        else:
            parts.append(rng.choice(plain))
        parts.append(rng.choice(glue))
    return "".join(parts)


def whole_ids(encoder: TextEncoder, text: str) -> list[int]:
    """The text encoded in one call of the backend: what slicing must reproduce."""
    return encoder._backend.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("split_special", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_slices_give_the_whole_text_ids_for_every_kind(kinds, kind, split_special, monkeypatch):
    encoder = TextEncoder(load_tokenizer(kinds[kind]), split_special, engine="hf")
    assert encoder.sliceable, encoder.cuts
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 61)
    for seed in range(3):
        text = hard_text(seed, 2500)
        slices = list(encoder.slices(text))
        assert len(slices) > 150
        assert np.concatenate(slices).tolist() == whole_ids(encoder, text), (kind, seed)


@pytest.mark.parametrize("kind", ["byte_level", "llama3", "wordpiece", "unigram"])
def test_every_place_the_rule_allows_is_a_safe_cut(kinds, kind):
    """Cut at every allowed place at once: each slice alone must still give its share."""
    encoder = TextEncoder(load_tokenizer(kinds[kind]), engine="hf")
    rule = encoder.cuts
    assert isinstance(rule, CutRule)
    text = hard_text(7, 3000)
    pieces = [piece for _start, piece in rule.pieces(text, 1)]
    assert len(pieces) > 500
    ids = [i for e in encoder._backend.encode_batch(pieces, add_special_tokens=False)
           for i in e.ids]
    assert ids == whole_ids(encoder, text)


def test_long_texts_go_through_slices_in_batches_and_with_fastokens(kinds, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 300)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 97)
    text = hard_text(3, 1500)
    for kind in ("llama3", "wordlevel_split", "sentencepiece_bpe"):
        for engine in ("hf", "auto"):
            encoder = TextEncoder(load_tokenizer(kinds[kind]), True, engine=engine)
            got = encoder.encode([text, "short one", text[:5000]])
            assert got[0].tolist() == whole_ids(encoder, text)
            assert got[1].tolist() == whole_ids(encoder, "short one")
            assert got[2].tolist() == whole_ids(encoder, text[:5000])


def test_rules_derived_for_the_kinds():
    def rule(kind: str) -> CutRule:
        from tokenizers import Tokenizer

        import zephon.demo.tokenizer_kinds as k

        tokenizer = k.KINDS[kind]()
        tokenizer.add_tokens(added_tokens())
        made = cut_rule(Tokenizer.to_str(tokenizer))
        assert isinstance(made, CutRule), made
        return made

    assert rule("byte_level").before == " \n" and not rule("byte_level").drop_space
    assert rule("metaspace_bpe").before == " "  # Metaspace does not split at a newline
    legacy = rule("sentencepiece_bpe")
    assert legacy.drop_space and legacy.before == " "
    assert legacy.inside == ("new york",) and legacy.after == ("<sep>",)
    assert "Unigram" in rule("unigram").kind and "Precompiled" in rule("unigram").kind


def spec_of(kind_dir: str) -> dict:
    with open(f"{kind_dir}/tokenizer.json") as f:
        return json.load(f)


def test_no_cut_is_guessed(kinds):
    """Every part that could join text across a cut gives no rule, and says which."""
    base = spec_of(kinds["wordlevel_split"])

    def with_parts(**parts) -> NoCuts | CutRule:
        return cut_rule(json.dumps({**base, **parts}))

    cases = {
        "Strip": with_parts(normalizer={"type": "Strip", "strip_left": True,
                                        "strip_right": True}),
        "regex": with_parts(normalizer={"type": "Replace", "pattern": {"Regex": "a b"},
                                        "content": "x"}),
        "spans a space": with_parts(normalizer={"type": "Replace",
                                                "pattern": {"String": "a b"}, "content": "x"}),
        "not known": with_parts(pre_tokenizer={"type": "Split", "pattern": {"Regex": r"\w+ "},
                                               "behavior": "Isolated", "invert": False}),
        "UnicodeScripts": with_parts(pre_tokenizer={"type": "UnicodeScripts"}),
        "moves the word": with_parts(pre_tokenizer={
            "type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
            "invert": False}),
        "WordLevel model needs": with_parts(pre_tokenizer=None),
    }
    for needle, made in cases.items():
        assert isinstance(made, NoCuts) and needle in made.reason, (needle, made)

    bpe = spec_of(kinds["llama2"])  # Metaspace without split: the vocabulary decides
    assert isinstance(cut_rule(json.dumps(bpe)), CutRule)
    crossing = json.loads(json.dumps(bpe))
    crossing["model"]["vocab"]["a\u2581b"] = len(crossing["model"]["vocab"])
    made = cut_rule(json.dumps(crossing))
    assert isinstance(made, NoCuts) and "'a▁b' spans one" in made.reason
    for option, value in [("end_of_word_suffix", "</w>"), ("ignore_merges", True),
                          ("dropout", 0.1)]:
        changed = json.loads(json.dumps(bpe))
        changed["model"][option] = value
        made = cut_rule(json.dumps(changed))
        assert isinstance(made, NoCuts) and option in made.reason
    prefixed = json.loads(json.dumps(bpe))
    prefixed["normalizer"] = {"type": "Prepend", "prepend": "\u2581"}
    prefixed["pre_tokenizer"] = None  # the prefix is not what a space becomes
    assert isinstance(cut_rule(json.dumps(prefixed)), NoCuts)
    gemma = json.loads(json.dumps(bpe))  # spaces replaced first: Split(" ") never matches
    gemma["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    gemma["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                              "behavior": "MergedWithPrevious", "invert": False}
    assert isinstance(cut_rule(json.dumps(gemma)), CutRule)


def test_the_guards_around_added_tokens():
    rule = CutRule("t", inside=("new york",), after=("<sep>",), added=("indeed",))
    assert rule.cut("go new york now", 0) == 2
    assert rule.cut("go new york now", 4) == 11  # not inside "new york"
    assert rule.cut("x<sep> y z", 0) == 8 and rule.cut("xsep y", 0) == 4
    assert rule.cut("ab \u0301x ok", 0) == 5  # not before a combining mark
    assert rule.cut("ab \ufb01x ok", 0) == 5  # nor next to a letter NFKC changes
    assert rule.cut("ab \u0d4e x", 0) is None  # nor around a prepend letter
    dropping = CutRule("t", drop_space=True, added=("indeed",))
    assert dropping.cut("x indeed y", 0) == 8  # not right before an added token
    assert [p for _s, p in dropping.pieces("aa bb cc", 1)] == ["aa", "bb", "cc"]
    assert [p for _s, p in CutRule("t").pieces("aa bb cc", 1)] == ["aa", " bb", " cc"]


def test_a_rule_that_fails_its_self_check_is_not_used(kinds, monkeypatch, caplog):
    """The self-check guards the derivation: a rule that would cut wrongly (here: keeping the
    space that a legacy SentencePiece normalizer then doubles) is dropped, with a warning."""
    legacy = spec_of(kinds["sentencepiece_bpe"])
    monkeypatch.setattr(long_text, "cut_rule", lambda _json: CutRule("forced"))
    monkeypatch.setattr(tokenizer_module, "_CUTS", {})
    from tokenizers import Tokenizer

    with caplog.at_level(logging.WARNING, logger="zephon.text.tokenizer"):
        encoder = TextEncoder(Tokenizer.from_str(json.dumps(legacy)))
    assert not encoder.sliceable and "do not encode to the whole text" in encoder.cuts.reason
    assert "long texts are not cut into slices" in caplog.text


def refusing_tokenizer(kinds, tmp_path) -> str:
    """The WordLevel kind behind a Strip normalizer: no safe cut can be derived."""
    import shutil

    out = tmp_path / "strip"
    shutil.copytree(kinds["wordlevel_split"], out)
    spec = spec_of(str(out))
    spec["normalizer"] = {"type": "Strip", "strip_left": True, "strip_right": True}
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return str(out)


def pipeline_over(path, tokenizer: str, **options):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("long", path)], shuffle_rows=False)
    return Pipeline(source).tokenize(tokenizer_id=tokenizer, engine="hf", **options) \
        .pack_flat(65).batch(2)


@pytest.mark.parametrize("max_document_tokens", [None, 64])
def test_a_long_text_that_cannot_be_cut_is_refused_by_name(kinds, tmp_path, max_document_tokens):
    from tests.conftest import write_jsonl

    tokenizer = refusing_tokenizer(kinds, tmp_path)
    limit = tokenizer_module.LONG_TEXT_CHARS
    text = "word " * (limit // 5 + 10)
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": "short one"}, {"text": text}])
    with pytest.raises(DataError) as caught:
        list(pipeline_over(path, tokenizer, max_unsliced_chars=limit,
                           max_document_tokens=max_document_tokens))
    message = str(caught.value)
    assert "docs.jsonl:2" in message and "WordLevel (normalizer Strip" in message
    assert "its normalizer Strip may join text across a cut" in message
    assert "max_unsliced_chars" in message and f"{len(text):,} characters" in message
    batches = list(pipeline_over(path, tokenizer, max_unsliced_chars=None,
                                 max_document_tokens=max_document_tokens))
    assert sum(int(r.payload["input_ids"].size) for b in batches for r in b.records) > limit // 6


def test_a_long_stretch_without_a_cut_is_refused_by_name(kinds, tmp_path):
    from tests.conftest import write_jsonl

    limit = tokenizer_module.LONG_TEXT_CHARS
    text = "Intro words here. " * 20 + "日本語のテキスト" * (limit // 8 + 1) + " end"
    path = write_jsonl(tmp_path / "cjk.jsonl", [{"text": text}])
    with pytest.raises(DataError, match=r"cjk.jsonl:1: field 'text' holds 262,1\d\d characters "
                                        r"from character 3\d\d that the tokenizer, a BPE .* "
                                        r"holds no space between letters or digits"):
        list(pipeline_over(path, kinds["byte_level"], max_unsliced_chars=limit,
                           max_document_tokens=512))
    ids = list(pipeline_over(path, kinds["byte_level"], max_unsliced_chars=limit + 1000,
                             max_document_tokens=512))
    assert ids


def test_max_unsliced_chars_is_checked():
    from zephon.ops.tokenize import TokenizeSpec

    for bad in (0, 1000, "big", True):
        with pytest.raises(ConfigError, match="max_unsliced_chars"):
            TokenizeSpec(tokenizer_id="x", max_unsliced_chars=bad)
    TokenizeSpec(tokenizer_id="x", max_unsliced_chars=None)
