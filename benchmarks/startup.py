"""Start-up cost of the tokenizer: small and production-sized vocabularies side by side.

Builds (once, cached under ``--root``) the throughput benchmark's corpus and its 8k-token
byte-level BPE, and trains a 128k-token one (the size of Llama 3's, a 9 MB ``tokenizer.json``)
on synthetic words, which takes about half a minute. Then, in a fresh process per tokenizer and
``--repeats`` times, alternating, it measures:

- ``read``: reading the saved tokenizer directory;
- ``encoder``: building the encoder over it (digest, settings; see :mod:`zephon.text.tokenizer`);
- ``pickled`` and ``unpickle``: the tokenize operator as it travels to each worker process of
  ``options(workers=N)``, and the time a worker takes to rebuild it;
- ``first`` and ``10th``: seconds from constructing the Pipeline to its first and tenth
  microbatch (``tokenize -> pack_flat(2049) -> batch(8)``, torch already imported).

Usage: ``python -m benchmarks.startup [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.throughput import build_corpus


def train_large_tokenizer(root: Path, vocab_size: int = 128_000) -> str:
    """A byte-level BPE of ``vocab_size`` tokens on random words over a 12-letter alphabet
    (enough distinct words to learn that many merges), saved as a tokenizer directory."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    target = root / f"tokenizer-{vocab_size}"
    if (target / "tokenizer_config.json").exists():
        return str(target)
    rng = random.Random(0)
    letters = "abcdefghijkl"

    def lines(n: int):
        for _ in range(n):
            yield " ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 12)))
                           for _ in range(50))

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(lines(40_000), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    return str(target)


def child(data: str, tokenizer: str) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has it loaded

    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.ops.base import BuildContext
    from zephon.ops.tokenize import TokenizeSpec
    from zephon.text.tokenizer import TextEncoder, _SavedFastTokenizer
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    start = time.perf_counter()
    saved = _SavedFastTokenizer.try_load(tokenizer)
    read = time.perf_counter() - start
    start = time.perf_counter()
    TextEncoder(saved)
    encoder = time.perf_counter() - start
    op = TokenizeSpec(tokenizer_id=tokenizer).build(BuildContext(seed=0, lanes=1))
    payload = pickle.dumps(op)
    start = time.perf_counter()
    pickle.loads(payload)
    unpickle = time.perf_counter() - start

    start = time.perf_counter()
    source = StaticMixtureWorkSource([Dataset.from_path("bench", data)],
                                     MixtureSpec({"bench": 1.0}), seed=0)
    stream = iter(Pipeline(source).tokenize(tokenizer_id=tokenizer, field="text")
                  .pack_flat(2049).batch(8))
    marks = []
    for _ in range(10):
        next(stream)
        marks.append(time.perf_counter() - start)
    return {"read": read, "encoder": encoder, "pickled_mb": len(payload) / 1e6,
            "unpickle": unpickle, "first": marks[0], "tenth": marks[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--child", nargs=2, metavar=("DATA", "TOKENIZER"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    root = Path(args.root)
    print(f"building corpus and tokenizers (cached under {root})", flush=True)
    paths = build_corpus(root, 10_000, 8)
    tokenizers = {"8k": paths["tokenizer"], "128k": train_large_tokenizer(root)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in tokenizers}
    for _ in range(args.repeats):
        for name, path in tokenizers.items():
            out = subprocess.run([sys.executable, "-m", "benchmarks.startup", "--child",
                                  paths["data"], path], capture_output=True, text=True,
                                 check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nvocabulary  read s  encoder s  pickled MB  unpickle s  first s  10th s   "
          f"(medians of {args.repeats})")
    for name, results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{name:>10}  {median['read']:6.2f}  {median['encoder']:9.2f}  "
              f"{median['pickled_mb']:10.1f}  {median['unpickle']:10.2f}  "
              f"{median['first']:7.2f}  {median['tenth']:6.2f}")


if __name__ == "__main__":
    main()
