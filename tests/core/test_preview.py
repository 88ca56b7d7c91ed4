"""zephon preview shows tokens as the tokenizer decodes them, and each document's dataset."""

from __future__ import annotations

import pytest

from zephon.demo.tokenizer_kinds import build_tokenizer
from zephon.preview import _decoder, first_batch, render_terminal, token_texts

TEXT = ("Grüße aus Köln 😀 — naïve café, 日本語のテキスト\n\tindented line and ﬁne print. "
        "Numbers 12345 and <tool_call>{\"a\": 1}</tool_call> end.")


@pytest.mark.parametrize("kind", ["byte_level", "llama2", "sentencepiece_bpe", "wordpiece",
                                  "unigram", "wordlevel_split"])
def test_token_texts_join_to_the_decoded_text(kind, tmp_path):
    from tokenizers import Tokenizer

    directory = build_tokenizer(kind, tmp_path / kind)
    backend = Tokenizer.from_file(f"{directory}/tokenizer.json")
    ids = backend.encode(TEXT, add_special_tokens=False).ids

    def decode(part):
        return backend.decode(part, skip_special_tokens=False)

    pieces = token_texts(ids, decode)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == decode(ids)
    assert not any(mark in piece for piece in pieces for mark in ("Ġ", "▁", "<0x", "##"))
    assert _decoder(directory)(ids) == pieces


def test_the_preview_names_each_documents_dataset():
    from pathlib import Path

    recipe = (Path(__file__).resolve().parents[2] / "recipes" / "torchtitan" / "data"
              / "pretrain_docmask.toml")
    rows = first_batch(recipe, rows=2, seq_len=64)
    assert all(len(r.datasets) == len(r.names) > 0 for r in rows)
    shown = render_terminal(rows)
    assert all(name in shown for r in rows for name in r.datasets)
    assert "Ġ" not in shown and "documents:" in shown
