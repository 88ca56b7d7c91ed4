"""Memory and state size for one very long document, for every kind of tokenizer.

For each tokenizer kind (:mod:`zephon.demo.tokenizer_kinds`: byte-level BPE, Llama 3's regex,
WordLevel with Whitespace and WhitespaceSplit, Metaspace BPE, Llama 2's BPE, legacy
SentencePiece BPE, T5-style Unigram, WordPiece) and each size (1, 5, 20 and 50 MB of text), a
fresh process reads a JSON Lines file holding one such document (plus a few short ones) through
``tokenize(max_document_tokens=2048) -> pack_flat(2049, "wrap") -> batch(8)`` with the default
read-ahead, to the end of the data. Prints the process's peak RSS (torch, the tokenizer and the
libraries loaded: the base), the peak above that base, the pickled state's size after 20
microbatches (inside the long document) and the time to the end.

``--whole`` instead encodes each text in one call of the ``tokenizers`` backend, as a
tokenizer without a safe cut would, and prints the peak above the base per character.

Usage: ``python -m benchmarks.long_document [--kinds byte_level unigram] [--sizes 1 5 20 50]
[--whole]``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status_mib(field: str) -> float:
    """VmRSS or VmHWM (peak) of this process in MiB. Unlike getrusage's ru_maxrss, which a
    child inherits from its parent across fork and exec, VmHWM is this process's own."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(path: str, tokenizer: str, whole: bool) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has it loaded

    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.text.tokenizer import resolve_encoder
    from zephon.work import StaticMixtureWorkSource

    encoder = resolve_encoder(tokenizer, None, engine="hf")
    encoder.encode(["warm up"])
    if whole:
        text = json.loads(Path(path).read_text().splitlines()[0])["text"]
        base = _status_mib("VmRSS")
        start = time.perf_counter()
        tokens = len(encoder._backend.encode(text, add_special_tokens=False).ids)
        return {"peak_mib": _status_mib("VmHWM"), "above_mib": _status_mib("VmHWM") - base,
                "bytes_per_char": (_status_mib("VmHWM") - base) * 2**20 / len(text),
                "tokens": tokens, "seconds": time.perf_counter() - start}
    base = _status_mib("VmRSS")
    source = StaticMixtureWorkSource([Dataset.from_path("long", path)], shuffle_rows=False)
    pipeline = (Pipeline(source)
                .tokenize(tokenizer_id=tokenizer, max_document_tokens=2048)
                .pack_flat(2049, "wrap").batch(8))
    start = time.perf_counter()
    state, batches = 0, 0
    for batches, _batch in enumerate(pipeline, 1):
        if batches == 20:
            state = len(pickle.dumps(pipeline.state_dict()))
    seconds = time.perf_counter() - start
    return {"peak_mib": _status_mib("VmHWM"), "above_mib": _status_mib("VmHWM") - base,
            "state_bytes": state, "batches": batches, "seconds": seconds}


def main() -> None:
    from zephon.demo.tokenizer_kinds import KINDS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--sizes", type=float, nargs="*", default=[1, 5, 20, 50])
    parser.add_argument("--whole", action="store_true",
                        help="encode each text whole instead (no pipeline)")
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        path, tokenizer, whole = args.child
        print(json.dumps(child(path, tokenizer, whole == "whole")))
        return
    from zephon.demo.assets import make_documents
    from zephon.demo.tokenizer_kinds import SCRIPTS, build_tokenizer

    words = " ".join(make_documents(400, seed=1)) + " " + " ".join(SCRIPTS) + " "
    if args.whole:
        print(f"{'kind':<22}{'MB':>5}{'peak RSS MiB':>14}{'above base':>12}{'bytes/char':>12}"
              f"{'tokens':>11}{'s':>7}")
    else:
        print(f"{'kind':<22}{'MB':>5}{'peak RSS MiB':>14}{'above base':>12}"
              f"{'state KiB':>11}{'batches':>9}{'s':>7}")
    with tempfile.TemporaryDirectory() as scratch:
        for kind in args.kinds:
            tokenizer = build_tokenizer(kind, Path(scratch) / kind)
            for mb in args.sizes:
                text = (words * int(mb * 1e6 / len(words) + 1))[:int(mb * 1e6)]
                path = Path(scratch) / f"long-{mb}.jsonl"
                if not path.exists():
                    with open(path, "w") as out:
                        out.write(json.dumps({"text": text}) + "\n")
                        for short in make_documents(20, seed=2):
                            out.write(json.dumps({"text": short}) + "\n")
                run = subprocess.run([sys.executable, "-m", "benchmarks.long_document",
                                      "--child", str(path), tokenizer,
                                      "whole" if args.whole else "pipeline"],
                                     capture_output=True, text=True, check=True)
                r = json.loads(run.stdout.strip().splitlines()[-1])
                if args.whole:
                    print(f"{kind:<22}{mb:>5g}{r['peak_mib']:>14.0f}{r['above_mib']:>12.0f}"
                          f"{r['bytes_per_char']:>12.0f}{r['tokens']:>11,}{r['seconds']:>7.1f}",
                          flush=True)
                else:
                    print(f"{kind:<22}{mb:>5g}{r['peak_mib']:>14.0f}{r['above_mib']:>12.0f}"
                          f"{r['state_bytes'] / 1024:>11.1f}{r['batches']:>9}"
                          f"{r['seconds']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
