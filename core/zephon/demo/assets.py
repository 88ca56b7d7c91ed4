"""Deterministic demo and test assets: a synthetic corpus and a small BPE tokenizer.

The corpus is pseudo-English: words drawn with Zipf-like frequencies from a fixed syllable
inventory, grouped into sentences and documents of seeded lengths. It is not language, but its
statistics are learnable (a model's loss falls quickly) and it compresses like text under BPE
(about 1.3 tokens per word with a 4096-token vocabulary). Building 2,000 documents and training
the tokenizer is not free (measured: docs/measurements.md), so results are cached under
``root``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zephon.progress import enabled, progress

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "an", "el", "or", "ven", "dra",
              "qui", "bel", "tor", "sa", "mon", "gra", "fi", "lu", "be", "cor", "thi", "ul",
              "pra", "sen", "do", "xa", "win"]
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ASSET_VERSION = "1"


def _vocabulary(rng: np.random.Generator, size: int = 3000) -> list[str]:
    words = set()
    while len(words) < size:
        n = int(rng.integers(1, 4))
        words.add("".join(rng.choice(_SYLLABLES, size=n)))
    return sorted(words)


def make_documents(n_docs: int, seed: int = 0, min_words: int = 40, max_words: int = 400
                   ) -> list[str]:
    """``n_docs`` pseudo-English documents, identical for identical arguments."""
    rng = np.random.default_rng([seed, 7])
    vocab = _vocabulary(np.random.default_rng(1234))
    ranks = np.arange(1, len(vocab) + 1)
    probs = 1.0 / ranks
    probs /= probs.sum()
    docs = []
    for _ in range(n_docs):
        n_words = int(rng.integers(min_words, max_words + 1))
        words = rng.choice(len(vocab), size=n_words, p=probs)
        cuts = np.cumsum(rng.integers(5, 15, size=n_words // 5 + 2))
        sentences, start = [], 0
        for cut in cuts:
            if start >= n_words:
                break
            chunk = [vocab[w] for w in words[start:min(cut, n_words)]]
            sentences.append(" ".join(chunk).capitalize() + ".")
            start = cut
        docs.append(" ".join(sentences))
    return docs


def train_tokenizer(texts: list[str], out_dir: str | os.PathLike[str],
                    vocab_size: int = 4096, extra_special: list[str] | None = None) -> str:
    """Train a byte-level BPE on ``texts`` and save it as a transformers tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [PAD, BOS, EOS, *(extra_special or [])]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=enabled())
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD)
    fast.save_pretrained(str(out_dir))
    return str(out_dir)


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message.get('content') or '')"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""A ChatML-style template without generation markers: tokenize_chat finds assistant turns by
rendering prefixes, and TorchTitan 0.3.0's tokenizer (plain Jinja, no ``generation`` tag) can
load it too."""

MARKED_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ (message.get('content') or '') + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "(message.get('content') or '') + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""The same conversations with ``{% generation %}`` markers around assistant replies:
tokenize_chat reads the trained tokens from the marks (one render, tokenized by the batch
call) instead of rendering prefixes."""


def make_conversations(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``n`` synthetic multi-turn conversations (system, user and assistant turns)."""
    rng = np.random.default_rng([seed, 13])
    sentences = [s + "." for d in make_documents(max(n // 2, 20), seed + 1, 20, 60)
                 for s in d.split(". ") if s]
    out = []
    for _ in range(n):
        turns = [{"role": "system", "content": "Answer in the demo language."}]
        for _ in range(int(rng.integers(1, 4))):
            question, answer = rng.choice(len(sentences), size=2)
            turns.append({"role": "user", "content": sentences[question].rstrip(".") + "?"})
            turns.append({"role": "assistant", "content": sentences[answer]})
        out.append(turns)
    return out


def build_chat_assets(root: str | os.PathLike[str] | None = None, n: int = 400,
                      seed: int = 0) -> dict[str, str]:
    """A JSONL chat corpus and a tokenizer with a chat template, built once under ``root``."""
    root = Path(root) if root is not None else default_root()
    return _built_once(root / f"chat-v{ASSET_VERSION}.2-{n}-{seed}",
                       lambda target: _build_chat_assets(target, n, seed))


def _built_once(target: Path, build: Callable[[Path], dict[str, str]]) -> dict[str, str]:
    """The paths ``build(target)`` made, built by one process only (the others wait for it)
    and read back from ``target/done.json`` ever after."""
    done = target / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    with _building(target):
        if done.exists():  # another process built it while this one waited
            return json.loads(done.read_text())
        return build(target)


def _build_chat_assets(target: Path, n: int, seed: int) -> dict[str, str]:
    from transformers import AutoTokenizer

    done = target / "done.json"
    (target / "chat").mkdir(parents=True, exist_ok=True)
    conversations = make_conversations(n, seed)
    with open(target / "chat" / "chat.jsonl", "w") as fh:
        for messages in conversations:
            fh.write(json.dumps({"messages": messages}) + "\n")
    texts = [m["content"] for c in conversations[:200] for m in c]
    train_tokenizer(texts, target / "tokenizer", vocab_size=2048,
                    extra_special=["<|im_start|>", "<|im_end|>"])
    tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(target / "tokenizer"))
    paths = {"chat": str(target / "chat"), "tokenizer": str(target / "tokenizer")}
    done.write_text(json.dumps(paths))
    return paths


def default_root() -> Path:
    base = os.environ.get("ZEPHON_DEMO_HOME")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zephon-demo"


def build_demo_assets(root: str | os.PathLike[str] | None = None, n_docs: int = 2000,
                      n_files: int = 4, seed: int = 0) -> dict[str, str]:
    """Corpus (Parquet files) and tokenizer under ``root``; built once, then reused."""
    root = Path(root) if root is not None else default_root()
    return _built_once(root / f"v{ASSET_VERSION}-{n_docs}-{n_files}-{seed}",
                       lambda target: _build_demo_assets(target, n_docs, n_files, seed))


def _building(target: Path) -> Any:
    """A lock held while ``target`` is built: processes that ask for the same assets at
    once (ranks of a launch, parallel test workers) build them once and never read a half
    written corpus."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(target) + ".lock")


def _build_demo_assets(target: Path, n_docs: int, n_files: int, seed: int) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = target / "done.json"
    corpus = target / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    docs = make_documents(n_docs, seed)
    per_file = -(-n_docs // n_files)
    for i in progress(range(n_files), desc="building the demo corpus", unit="file"):
        part = docs[i * per_file:(i + 1) * per_file]
        table = pa.table({"id": [f"doc-{i * per_file + j}" for j in range(len(part))],
                          "text": part})
        pq.write_table(table, corpus / f"part-{i:05d}.parquet", row_group_size=128)
    tokenizer_dir = train_tokenizer(docs[:1000], target / "tokenizer")
    paths = {"corpus": str(corpus), "tokenizer": tokenizer_dir}
    done.write_text(json.dumps(paths))
    return paths
