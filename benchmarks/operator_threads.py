"""Document threads for each kind of document operator, on and off, side by side in one run.

With ``workers=0`` and a producer thread (``prefetch > 0``) a dataset's read-ahead batches go
to the rank's document threads only when one of its operators releases the GIL for its work
(``DocumentOperator.releases_gil``: tokenize, and tokenize_chat with a template that marks the
replies); pretokenized ids, map/filter functions and prefix-rendered chat stay on the producer
thread. This measures both choices for five sources, in fresh subprocesses, alternating
``--repeats`` times:

- ``parquet``: ``pretokenized`` over Parquet files with a ``list<int32>`` column (the corpus
  of ``benchmarks/pretokenized.py``);
- ``indexed``: ``pretokenized`` over the same documents as a Megatron indexed dataset;
- ``chat``: ``tokenize_chat`` over the demo's JSONL conversations (``zephon.demo.assets``),
  turns of one sentence: rendering the chat template (Python) is most of the work;
- ``long chat``: the same over conversations whose turns are documents of 50-400 words;
- ``marked chat``: the long conversations with a template that marks the assistant replies
  (``{% generation %}``): one render, then the tokenizer's batch call (the GIL released),
  where the unmarked template takes two renders per reply and an encode that holds the GIL.

Each runs ``-> pack_flat(2049, "wrap") -> batch(8) -> to_training(return_labels=True)`` with
``prefetch=4``, the loop taking batches as fast as it can. Prints tokens/s, CPU seconds per
million tokens and the process's voluntary context switches (each one a thread that blocked,
most of them on the GIL), with the median ratio of side-by-side pairs, and which choice the
pipeline makes. Usage: ``python -m benchmarks.operator_threads [--docs 20000] [--chats 6000]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("threads", "no threads")


def pipeline_for(kind: str, paths: dict[str, str]):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("bench", paths[kind])], seed=0)
    pipeline = Pipeline(source).options(prefetch=4, workers=0)
    if kind.endswith("chat"):
        from zephon.demo.assets import MARKED_CHAT_TEMPLATE

        template = MARKED_CHAT_TEMPLATE if kind == "marked chat" else None
        pipeline = pipeline.tokenize_chat(tokenizer_id=paths["tokenizer"],
                                          chat_template=template)
    else:
        pipeline = pipeline.pretokenized(eos_token_id=0)
    return pipeline.pack_flat(2049, "wrap").batch(8, drop_last=False)


def child(kind: str, mode: str, paths: dict[str, str]) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    from zephon.engine.document_threads import DocumentThreads

    chosen = mode == "threads"  # forced for every dataset, whatever its operators say
    DocumentThreads.takes = staticmethod(lambda ops: bool(ops) and chosen)  # type: ignore
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, switches = usage.ru_utime + usage.ru_stime, usage.ru_nvcsw
    start = time.perf_counter()
    tokens = 0
    for batch in pipeline_for(kind, paths):
        tokens += int(batch.to_training(return_labels=True)["input_ids"].numel()) + len(batch)
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"tokens": tokens, "seconds": elapsed,
            "cpu": usage.ru_utime + usage.ru_stime - cpu,
            "switches": usage.ru_nvcsw - switches}


def build_long_chats(root: Path, n: int) -> str:
    """``n`` conversations of a system turn and two exchanges whose turns are documents of
    50-400 words, as JSONL (built once under ``root``)."""
    from zephon.demo.assets import make_documents

    target = root / f"long-chat-{n}"
    path = target / "chat.jsonl"
    if not path.exists():
        target.mkdir(parents=True, exist_ok=True)
        turns = iter(make_documents(4 * n, seed=7, min_words=50, max_words=400))
        with open(path.with_suffix(".tmp"), "w") as out:
            for _ in range(n):
                messages = [{"role": "system", "content": "Answer in the demo language."}]
                messages += [{"role": role, "content": next(turns)}
                             for role in ("user", "assistant", "user", "assistant")]
                out.write(json.dumps({"messages": messages}) + "\n")
        path.with_suffix(".tmp").rename(path)
    return str(target)


def default_choice(kind: str, paths: dict[str, str]) -> str:
    """What the pipeline picks for ``kind``: the document threads' answer for its operators."""
    from zephon.engine.document_threads import DocumentThreads

    pipeline = pipeline_for(kind, paths)
    ops = pipeline.loader().document_ops  # built, nothing read yet
    return MODES[0] if DocumentThreads.takes(ops) else MODES[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--chats", type=int, default=6_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "MODE"))
    parser.add_argument("--paths")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, json.loads(args.paths))))
        return
    from benchmarks.pretokenized import build_corpus
    from zephon.demo.assets import build_chat_assets

    corpus = build_corpus(Path(args.root), args.docs)
    chat = build_chat_assets(args.root, n=args.chats)
    paths = {"parquet": corpus["parquet"], "indexed": corpus["indexed"], "chat": chat["chat"],
             "tokenizer": chat["tokenizer"]}
    paths["long chat"] = paths["marked chat"] = build_long_chats(Path(args.root),
                                                                 args.chats // 4)
    kinds = ("parquet", "indexed", "chat", "long chat", "marked chat")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for kind in kinds:
            for mode in MODES:
                out = subprocess.run([sys.executable, "-m", "benchmarks.operator_threads",
                                      "--child", kind, mode, "--paths", json.dumps(paths)],
                                     check=True, capture_output=True, text=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault((kind, mode), []).append(result)
                print(f"  run {repeat + 1} {kind:<11} {mode:<10} "
                      f"{result['tokens'] / result['seconds'] / 1e6:6.2f}M tokens/s, "
                      f"{result['cpu']:.2f} s CPU, {result['switches']:,} context switches",
                      flush=True)
    print()
    for kind in kinds:
        on, off = runs[(kind, MODES[0])], runs[(kind, MODES[1])]
        tokens = on[0]["tokens"]

        def rate(run: dict[str, float]) -> float:
            return run["tokens"] / run["seconds"]

        line = [f"{kind:<11} pipeline picks {default_choice(kind, paths)!r}:"]
        for mode, group in zip(MODES, (on, off), strict=True):
            line.append(f"{mode} {statistics.median(rate(r) for r in group) / 1e6:.2f}M "
                        f"tokens/s, {statistics.median(r['cpu'] for r in group) * 1e6 / tokens:.3f}"
                        f" CPU s per M tokens, "
                        f"{statistics.median(r['switches'] for r in group) * 1e6 / tokens:,.0f}"
                        " switches per M tokens;")
        ratio = statistics.median(rate(b) / rate(a) for a, b in zip(on, off, strict=True))
        cpu = statistics.median(b["cpu"] / a["cpu"] for a, b in zip(on, off, strict=True))
        line.append(f"no threads / threads: {ratio:.2f}x tokens/s, {cpu:.2f}x CPU "
                    "(medians of side-by-side pairs)")
        print(" ".join(line))


if __name__ == "__main__":
    main()
