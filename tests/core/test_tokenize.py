"""tokenize and tokenizer loading."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from zephon.errors import ConfigError
from zephon.ops.tokenize import DocumentTokenizer, TokenizeSpec
from zephon.tokenizer import load_tokenizer


def test_bos_eos_added_per_document(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    hf = load_tokenizer(tokenizer_dir)
    [[doc]] = tok.encode(["Kalo mi ne."])
    assert doc[0] == hf.bos_token_id and doc[-1] == hf.eos_token_id
    assert doc.dtype == np.int32
    assert hf.decode(doc[1:-1]) == "Kalo mi ne."


def test_add_bos_false_and_missing_special(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=False))
    [[doc]] = tok.encode(["ka"])
    assert doc[0] != load_tokenizer(tokenizer_dir).bos_token_id
    from tokenizers import Tokenizer

    raw = Tokenizer.from_str(load_tokenizer(tokenizer_dir).backend_tokenizer.to_str())
    with pytest.raises(ConfigError, match="add_bos=True but the tokenizer has no BOS"):
        DocumentTokenizer(TokenizeSpec(tokenizer=raw, add_bos=True))


def test_long_documents_split_when_asked(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, max_document_tokens=8))
    text = " ".join(["kalo"] * 40)
    [pieces] = tok.encode([text])
    whole = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir)).encode([text])[0][0]
    assert all(len(p) <= 8 for p in pieces) and len(pieces) > 3
    assert (np.concatenate(pieces) == whole).all()


def test_empty_text_gives_no_document(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    assert tok.encode(["", "ka"])[0] == []


def test_batch_size_changes_nothing(tokenizer_dir, demo_assets):
    from zephon.demo.assets import make_documents

    texts = make_documents(40, seed=3)
    a = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, batch_size=1))
    b = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, batch_size=64))
    one = [p for t in texts for p in a.encode([t])]
    many = b.encode(texts)
    assert all((x[0] == y[0]).all() for x, y in zip(one, many, strict=True))


def test_missing_local_tokenizer_fails_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(ConfigError, match="no such directory"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer"))
    with pytest.raises(ConfigError, match="no such directory"):
        load_tokenizer("./not-here")
    assert time.monotonic() - start < 2


def test_loading_leaves_environment_and_threads_alone(tmp_path):
    from zephon.demo.assets import make_documents, train_tokenizer

    path = train_tokenizer(make_documents(30, seed=5), tmp_path / "t", vocab_size=400)
    environ = dict(os.environ)
    threads = torch.get_num_threads()
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=path))
    tok.encode(make_documents(50, seed=6))
    assert dict(os.environ) == environ
    assert torch.get_num_threads() == threads


def test_spec_validation():
    with pytest.raises(ConfigError, match="exactly one"):
        TokenizeSpec()
    with pytest.raises(ConfigError, match="max_document_tokens"):
        TokenizeSpec(tokenizer_id="x", max_document_tokens=1)


@pytest.mark.parametrize("which", ["demo", "chat"])
def test_long_texts_in_slices_give_the_whole_text_tokens(which, tokenizer_dir, tmp_path,
                                                         monkeypatch):
    import random

    import zephon.tokenizer as tokenizer_module
    from zephon.demo.assets import build_chat_assets, make_documents
    from zephon.tokenizer import TextEncoder

    path = tokenizer_dir if which == "demo" else build_chat_assets(tmp_path, n=20)["tokenizer"]
    encoder = TextEncoder(load_tokenizer(path))
    assert encoder._sliceable
    rng = random.Random(3)
    words = " ".join(make_documents(30, seed=5)).split(" ")
    pieces = []
    for word in words[:3000]:  # spaces, runs of spaces, newlines, tabs and punctuation
        pieces.append(word + rng.choice([" ", " ", " ", "  ", "\n", " \n ", "\t", ", ", ". "]))
    text = "".join(pieces)
    whole = encoder.encode([text])[0]
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 200)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 97)
    sliced = encoder.encode([text, "short"])
    assert np.array_equal(sliced[0], whole)
    assert np.array_equal(sliced[1], encoder.encode(["short"])[0])
