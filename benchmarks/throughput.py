"""Loader throughput against the bare tokenizer, side by side in one run.

Builds (once, cached under ``--root``) a corpus of ``--docs`` pseudo-English documents of
200-2000 words in several Parquet files and a byte-level BPE tokenizer, then measures in fresh
subprocesses, alternating ``--repeats`` times:

- ``bare``: the HF fast tokenizer (Rust backend) batch-encoding the same texts, 256 per call,
  ids converted to int32 arrays the way the pipeline converts them (``zephon.text.tokenizer.
  ids_array``, about 10 ns a token cheaper than ``np.array(ids, dtype=np.int32)``): the floor
  any loader that tokenizes on the fly pays. The texts are read from Parquet beforehand, out
  of its time, which the pipeline's includes; the pipeline is also compared with the bare
  tokenizer's time plus its reading;
- ``bare-2``: the same loop with two calls in flight (two threads taking turns at the texts),
  so the cores also encode while one thread converts ids: the most that keeping the cores on
  the tokenizer gains on this machine, and what running two calls at once costs in CPU;
- ``hf-call``: the transformers tokenizer's batch call (``tokenizer(texts)["input_ids"]``, 256
  texts a call), as a hand-written loop that tokenizes on the fly uses it;
- ``bare-fast``: the fast engine (``fastokens``, where installed) over the same texts, 256 per
  call, through its flat call (one buffer of ids and one of offsets) and cut into one int32
  array per text, as the pipeline's fast path does;
- ``pipeline``: ``tokenize -> pack_flat(2049, "wrap") -> batch(8) -> to_training(return_labels)``
  over the same files, from constructing the Pipeline to the last batch, once per
  ``--workers`` value (``options(workers=N)``: N processes run the tokenizer; their CPU time
  is counted with the pipeline's) and per ``--engines`` value (``tokenize(engine=...)``).

After the timed runs, each engine's pipeline runs once more, untimed, hashing every
microbatch's ids: the script prints whether the engines delivered identical tokens.

Prints tokens/s of each (medians), the median ratio of side-by-side pairs in throughput and in
CPU seconds per token, how many cores each kept busy (CPU over wall seconds), the pipeline's
time to first batch, its CPU split by thread (its Python threads by name, sampled every 32
batches, the unit reader decoding the next Parquet units among them; the rest is native
threads: the tokenizer's pool; with workers, the worker processes), and the peak RSS of each
process (of the largest worker process too).
Usage: ``python -m benchmarks.throughput [--docs 10000] [--workers 0,2] [--engines hf,fastokens]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def build_corpus(root: Path, n_docs: int, n_files: int, vocab: int = 8192) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.demo.assets import make_documents, train_tokenizer

    target = root / (f"corpus-{n_docs}-{n_files}" + (f"-v{vocab}" if vocab != 8192 else ""))
    done = target / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    (target / "data").mkdir(parents=True, exist_ok=True)
    per_file = -(-n_docs // n_files)
    sample = []
    for i in range(n_files):
        docs = make_documents(min(per_file, n_docs - i * per_file), seed=100 + i,
                              min_words=200, max_words=2000)
        sample += docs[:300]
        pq.write_table(pa.table({"text": docs}), target / "data" / f"part-{i:04d}.parquet",
                       row_group_size=256)
    tokenizer = train_tokenizer(sample, target / "tokenizer", vocab_size=vocab)
    paths = {"data": str(target / "data"), "tokenizer": tokenizer}
    done.write_text(json.dumps(paths))
    return paths


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_peak_rss_mib(pid: int) -> float:
    """Peak RSS (``VmHWM``) of a live process. A spawned worker's own: ``RUSAGE_CHILDREN``
    would also count its moment between fork and exec, when the parent's resident pages
    (torch and all, about 300 MiB here) show as its own."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(*who: int) -> float:
    """CPU time of this process and of its finished children (worker processes), or of those
    of ``resource.RUSAGE_SELF`` and ``RUSAGE_CHILDREN`` named."""
    total = 0.0
    for one in who or (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(one)
        total += usage.ru_utime + usage.ru_stime
    return total


def read_texts(paths: dict[str, str]) -> list[str]:
    import pyarrow.parquet as pq

    texts = []
    for path in sorted(Path(paths["data"]).glob("*.parquet")):
        texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
    return texts


def bare_encode(paths: dict[str, str]) -> Any:
    """The Rust tokenizer's batch call, as the pipeline makes it (no special tokens)."""
    from zephon.text.tokenizer import load_tokenizer

    backend = load_tokenizer(paths["tokenizer"]).backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return lambda texts: encode(texts, add_special_tokens=False)


def encode_tokens(encode: Any, texts: list[str]) -> int:
    """Encodes ``texts`` and converts each text's ids to an array, as the pipeline does."""
    from zephon.text.tokenizer import ids_array

    return sum(ids_array(encoding.ids).size for encoding in encode(texts))


def child_bare(paths: dict[str, str]) -> dict[str, float]:
    import pyarrow.parquet  # noqa: F401 - imported before the reading is timed, as the pipeline's is

    read_start = time.perf_counter()
    texts = read_texts(paths)
    read_seconds = time.perf_counter() - read_start
    encode = bare_encode(paths)
    cpu = cpu_seconds()
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 256):
        tokens += encode_tokens(encode, texts[i:i + 256])
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "cpu": cpu_seconds() - cpu,
            "read_seconds": read_seconds, "rss_mib": peak_rss_mib()}


def child_bare_two(paths: dict[str, str]) -> dict[str, float]:
    """The bare loop with two calls in flight: two threads take turns at the same chunks."""
    texts = read_texts(paths)
    encode = bare_encode(paths)
    chunks = iter(range(0, len(texts), 256))
    lock = threading.Lock()
    counts = []

    def encode_chunks() -> None:
        tokens = 0
        while True:
            with lock:
                i = next(chunks, None)
            if i is None:
                break
            tokens += encode_tokens(encode, texts[i:i + 256])
        counts.append(tokens)

    cpu = cpu_seconds()
    start = time.perf_counter()
    threads = [threading.Thread(target=encode_chunks) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    return {"tokens": sum(counts), "seconds": elapsed, "cpu": cpu_seconds() - cpu,
            "rss_mib": peak_rss_mib()}


def child_bare_fast(paths: dict[str, str]) -> dict[str, float]:
    """The fast engine's flat batch call, each text's ids cut out as an int32 array."""
    import fastokens
    import numpy as np

    texts = read_texts(paths)
    engine = fastokens.Tokenizer.from_file(str(Path(paths["tokenizer"]) / "tokenizer.json"))
    cpu = cpu_seconds()
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 256):
        flat, offsets = engine.encode_batch_flat(texts[i:i + 256])
        ids = np.frombuffer(flat, np.uint32).astype(np.int32)
        bounds = np.frombuffer(offsets, np.uint64).tolist()
        tokens += sum(ids[a:b].size for a, b in itertools.pairwise(bounds))
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "cpu": cpu_seconds() - cpu,
            "rss_mib": peak_rss_mib()}


def child_digest(paths: dict[str, str], engine: str) -> dict[str, str]:
    """A digest of every microbatch's ids from the pipeline with ``engine`` (untimed)."""
    import hashlib

    digest = hashlib.sha256()
    for batch in bench_pipeline(paths, 0, engine):
        for record in batch.records:
            digest.update(record.payload["input_ids"].tobytes())
    return {"digest": digest.hexdigest()}


def fast_engine_installed() -> bool:
    try:
        import fastokens  # noqa: F401
    except ImportError:
        return False
    return True


def bench_pipeline(paths: dict[str, str], workers: int, engine: str) -> Any:
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_path("bench", paths["data"])],
                                     MixtureSpec({"bench": 1.0}), seed=0)
    return (Pipeline(source).options(workers=workers)
            .tokenize(tokenizer_id=paths["tokenizer"], field="text", engine=engine)
            .pack_flat(2049, "wrap").batch(8, drop_last=False))


class ThreadCPU:
    """CPU seconds of this process's Python threads, grouped by name. Each live thread's CPU
    clock is read at every :meth:`sample`; a thread that ends between samples keeps its last
    reading. The main thread counts from construction."""

    def __init__(self) -> None:
        self._latest: dict[int, tuple[str, float]] = {}
        self._main_start = self._read(threading.main_thread()) or 0.0

    @staticmethod
    def _read(thread: threading.Thread) -> float | None:
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError):  # ended meanwhile, or not started yet
            return None

    def sample(self) -> None:
        for thread in threading.enumerate():
            seconds = self._read(thread)
            if seconds is not None:
                self._latest[thread.ident] = (thread.name, seconds)

    def totals(self, group: Any) -> dict[str, float]:
        """Seconds summed over the threads whose names ``group`` maps to the same key."""
        totals: dict[str, float] = {}
        main = threading.main_thread().ident
        for ident, (name, seconds) in self._latest.items():
            if ident == main:
                seconds -= self._main_start
            totals[group(name)] = totals.get(group(name), 0.0) + seconds
        return totals


def child_hf_call(paths: dict[str, str]) -> dict[str, float]:
    """The transformers tokenizer's batch call, as a hand-written on-the-fly loop uses it."""
    import numpy as np
    from transformers import AutoTokenizer

    texts = read_texts(paths)
    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    cpu = cpu_seconds()
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 256):
        for ids in tokenizer(texts[i:i + 256], add_special_tokens=False)["input_ids"]:
            tokens += np.array(ids, dtype=np.int32).size
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "cpu": cpu_seconds() - cpu,
            "rss_mib": peak_rss_mib()}


def thread_role(name: str) -> str:
    if name == "MainThread":
        return "training loop"
    if name.startswith("zephon-rank"):
        return "lanes"
    if name == "zephon-documents":
        return "document threads"
    if name == "zephon-unit-reader":
        return "unit reader"
    return "other Python threads"  # the worker processes' hand-off (multiprocessing)


def child_pipeline(paths: dict[str, str], workers: int, engine: str) -> dict[str, float]:
    import gc

    import torch  # noqa: F401 - a trainer has torch loaded before it builds its loader

    import zephon  # noqa: F401 - imported before timing, as a trainer has it

    threads_cpu = ThreadCPU()
    cpu = cpu_seconds()
    own_cpu = cpu_seconds(resource.RUSAGE_SELF)
    workers_cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    pipeline = bench_pipeline(paths, workers, engine)
    tokens = 0
    first = None
    for step, batch in enumerate(pipeline):
        out = batch.to_training(return_labels=True)
        tokens += int(out["input_ids"].numel()) + len(batch)
        if first is None:
            first = time.perf_counter() - start
        if step % 32 == 0:
            threads_cpu.sample()
    elapsed = time.perf_counter() - start
    threads_cpu.sample()
    own_cpu = cpu_seconds(resource.RUSAGE_SELF) - own_cpu
    split = threads_cpu.totals(thread_role)
    split["native threads"] = own_cpu - sum(split.values())
    report = pipeline.report()
    worker_rss = max((process_peak_rss_mib(p.pid) for p in multiprocessing.active_children()),
                     default=0.0)
    del pipeline
    gc.collect()  # stops the worker processes, so their CPU time is counted
    if workers:
        split["worker processes"] = cpu_seconds(resource.RUSAGE_CHILDREN) - workers_cpu
    return {"tokens": tokens, "seconds": elapsed, "cpu": cpu_seconds() - cpu, "cpu_split": split,
            "first_batch_s": first, "worker_rss_mib": worker_rss,
            "rss_mib": peak_rss_mib(), "padding": report.padding_tokens,
            "documents": sum(d.documents for d in report.datasets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=".bench")
    parser.add_argument("--vocab", type=int, default=8192,
                        help="tokenizer vocabulary to train (the fast engine loads larger "
                        "ones for longer)")
    parser.add_argument("--workers", default="0",
                        help="comma-separated worker counts to measure the pipeline with")
    parser.add_argument("--engines", default=None,
                        help="comma-separated tokenize engines for the pipeline (default: hf, "
                        "and fastokens where installed)")
    parser.add_argument("--child")
    parser.add_argument("--paths")
    args = parser.parse_args()
    if args.child:
        paths = json.loads(args.paths)
        if args.child == "bare":
            result = child_bare(paths)
        elif args.child == "bare-2":
            result = child_bare_two(paths)
        elif args.child == "hf-call":
            result = child_hf_call(paths)
        elif args.child == "bare-fast":
            result = child_bare_fast(paths)
        elif args.child.startswith("digest:"):
            result = child_digest(paths, args.child.split(":")[1])
        else:
            _, workers, engine = args.child.split(":")
            result = child_pipeline(paths, int(workers), engine)
        print(json.dumps(result))
        return
    print(f"building corpus: {args.docs} documents in {args.files} Parquet files "
          f"(cached under {args.root})", flush=True)
    paths = build_corpus(Path(args.root), args.docs, args.files, args.vocab)
    fast = fast_engine_installed()
    engines = args.engines.split(",") if args.engines else ["hf", *(["fastokens"] if fast
                                                                   else [])]
    kinds = ["bare", "bare-2", "hf-call", *(["bare-fast"] if fast else []),
             *(f"pipeline:{int(w)}:{e}" for w in args.workers.split(",") for e in engines)]
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        for kind in kinds:
            out = subprocess.run([sys.executable, __file__, "--child", kind, "--paths",
                                  json.dumps(paths)], capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[kind].append(result)
            print(f"  run {repeat + 1} {kind:<20} {result['tokens'] / result['seconds']:>12,.0f} "
                  f"tokens/s  ({result['tokens']:,} tokens, {result['seconds']:.1f} s wall, "
                  f"{result['cpu']:.1f} s CPU, "
                  f"peak RSS {result['rss_mib']:.0f} MiB)", flush=True)
    def rate(run: dict[str, float]) -> float:
        return run["tokens"] / run["seconds"]

    def busy(kind: str) -> float:
        return statistics.median(r["cpu"] / r["seconds"] for r in runs[kind])

    cores = len(os.sched_getaffinity(0))
    bare = statistics.median(rate(r) for r in runs["bare"])
    print(f"\nbare tokenizer      {bare:>12,.0f} tokens/s, {busy('bare'):.2f} of {cores} cores "
          f"busy, peak RSS {max(r['rss_mib'] for r in runs['bare']):.0f} MiB")
    two = statistics.median(rate(r) for r in runs["bare-2"])
    two_pairs = list(zip(runs["bare-2"], runs["bare"], strict=True))
    print(f"two calls in flight {two:>12,.0f} tokens/s: "
          f"{statistics.median(rate(t) / rate(b) for t, b in two_pairs):.2f}x the bare "
          f"tokenizer, {statistics.median(per_token(t) / per_token(b) for t, b in two_pairs):.2f}x"
          f" its CPU per token, {busy('bare-2'):.2f} of {cores} cores busy")
    hf = statistics.median(rate(r) for r in runs["hf-call"])
    hf_vs_bare = statistics.median(rate(h) / rate(b) for h, b in zip(
        runs["hf-call"], runs["bare"], strict=True))
    print(f"transformers call   {hf:>12,.0f} tokens/s: {hf_vs_bare:.2f}x the bare tokenizer")
    if "bare-fast" in runs:
        fast_rate = statistics.median(rate(r) for r in runs["bare-fast"])
        fast_vs_bare = statistics.median(rate(f) / rate(b) for f, b in zip(
            runs["bare-fast"], runs["bare"], strict=True))
        print(f"bare fast engine    {fast_rate:>12,.0f} tokens/s: {fast_vs_bare:.2f}x the bare "
              f"tokenizer, {busy('bare-fast'):.2f} of {cores} cores busy")
    for kind in (k for k in kinds if k.startswith("pipeline:")):
        pipe = statistics.median(r["tokens"] / r["seconds"] for r in runs[kind])
        first = statistics.median(r["first_batch_s"] for r in runs[kind])
        # Ratios of adjacent runs: a shared machine's speed drifts more between repeats than
        # between two runs a few seconds apart.
        pairs = list(zip(runs[kind], runs["bare"], strict=True))
        ratio = statistics.median((p["tokens"] / p["seconds"]) / (b["tokens"] / b["seconds"])
                                  for p, b in pairs)
        with_reading = statistics.median(
            (p["tokens"] / p["seconds"]) / (b["tokens"] / (b["seconds"] + b["read_seconds"]))
            for p, b in pairs)
        cpu_ratio = statistics.median(per_token(p) / per_token(b) for p, b in pairs)
        hf_ratio = statistics.median((p["tokens"] / p["seconds"]) / (h["tokens"] / h["seconds"])
                                     for p, h in zip(runs[kind], runs["hf-call"], strict=True))
        _, workers, engine = kind.split(":")
        worker_rss = max(r["worker_rss_mib"] for r in runs[kind])
        print(f"pipeline workers={workers:<2} engine={engine:<9} {pipe:>10,.0f} tokens/s: "
              f"{ratio:.2f}x the bare "
              f"tokenizer ({with_reading:.2f}x with its Parquet reading timed too), "
              f"{cpu_ratio:.2f}x its CPU per token, {hf_ratio:.2f}x the "
              f"transformers call (medians of side-by-side pairs); first batch {first:.2f} s; "
              f"peak RSS {max(r['rss_mib'] for r in runs[kind]):.0f} MiB"
              + (f" + {worker_rss:.0f} MiB per worker" if worker_rss else ""))
        split = {part: statistics.median(r["cpu_split"].get(part, 0.0) for r in runs[kind])
                 for part in runs[kind][0]["cpu_split"]}
        print(f"  {busy(kind):.2f} of {cores} cores busy; CPU seconds by thread (medians): "
              + ", ".join(f"{part} {seconds:.2f}" for part, seconds in
                          sorted(split.items(), key=lambda item: -item[1])))
    print_identity(paths, engines)


def print_identity(paths: dict[str, str], engines: list[str]) -> None:
    """Runs each engine's pipeline once more, untimed, and says whether the ids are equal."""
    if len(engines) < 2:
        return
    digests = {}
    for engine in engines:
        out = subprocess.run([sys.executable, __file__, "--child", f"digest:{engine}",
                              "--paths", json.dumps(paths)], capture_output=True, text=True,
                             check=True)
        digests[engine] = json.loads(out.stdout.strip().splitlines()[-1])["digest"]
    same = len(set(digests.values())) == 1
    print(f"tokens identical across engines {', '.join(engines)}: {'yes' if same else 'NO'} "
          f"(sha256 of every microbatch's ids: "
          + ", ".join(f"{e} {d[:12]}" for e, d in digests.items()) + ")")


def per_token(run: dict[str, float]) -> float:
    return run["cpu"] / run["tokens"]


if __name__ == "__main__":
    main()
