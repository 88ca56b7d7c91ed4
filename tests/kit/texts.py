"""Texts for tokenizer tests: a long document built from the demo corpus."""

from __future__ import annotations


def long_text(words: int) -> str:
    from zephon.demo.assets import make_documents

    return " ".join(" ".join(make_documents(40, seed=6)).split(" ")[:words])
