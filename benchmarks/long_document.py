"""Memory and state size for one very long document.

For each size (1, 5, 20 and 50 MB of text) a fresh process reads a JSON Lines file holding one
such document (plus a few short ones) through ``tokenize -> pack_flat(2049) -> batch(8)``
(default read-ahead), with and without ``max_document_tokens=2048``, takes (up to) 20
microbatches and a state. Prints the process's peak RSS (torch, the tokenizer and the libraries
loaded: the base), the peak above that base, the size of the pickled state and the time to
the 20th microbatch.

Usage: ``python -m benchmarks.long_document [--sizes 1 5 20 50]``.
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


def child(path: str, tokenizer: str, limit: int | None) -> dict[str, float]:
    import torch  # noqa: F401 - a trainer has it loaded

    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.tokenizer import resolve_encoder
    from zephon.work import StaticMixtureWorkSource

    resolve_encoder(tokenizer, None).encode(["warm up"])
    base = _status_mib("VmRSS")
    source = StaticMixtureWorkSource([Dataset.from_path("long", path)], shuffle_rows=False)
    pipeline = (Pipeline(source)
                .tokenize(tokenizer_id=tokenizer, max_document_tokens=limit)
                .pack_flat(2049).batch(8))
    start = time.perf_counter()
    for _, _batch in zip(range(20), pipeline, strict=False):
        pass
    seconds = time.perf_counter() - start
    state = len(pickle.dumps(pipeline.state_dict()))
    return {"peak_mib": _status_mib("VmHWM"), "above_mib": _status_mib("VmHWM") - base,
            "state_bytes": state, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="*", default=[1, 5, 20, 50])
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        path, tokenizer, limit = args.child
        print(json.dumps(child(path, tokenizer, int(limit) if limit != "none" else None)))
        return
    from zephon.demo.assets import build_demo_assets, make_documents

    tokenizer = build_demo_assets()["tokenizer"]
    words = " ".join(make_documents(400, seed=1))
    print(f"{'MB':>5}{'max_document_tokens':>21}{'peak RSS MiB':>14}{'above base':>12}"
          f"{'state KiB':>11}{'20 batches s':>14}")
    with tempfile.TemporaryDirectory() as scratch:
        for mb in args.sizes:
            text = (words * int(mb * 1e6 / len(words) + 1))[:int(mb * 1e6)]
            path = Path(scratch) / f"long-{mb}.jsonl"
            with open(path, "w") as out:
                out.write(json.dumps({"text": text}) + "\n")
                for short in make_documents(20, seed=2):
                    out.write(json.dumps({"text": short}) + "\n")
            for limit in ("2048", "none"):
                run = subprocess.run([sys.executable, "-m", "benchmarks.long_document",
                                      "--child", str(path), tokenizer, limit],
                                     capture_output=True, text=True, check=True)
                result = json.loads(run.stdout.strip().splitlines()[-1])
                print(f"{mb:>5g}{limit:>21}{result['peak_mib']:>14.0f}"
                      f"{result['above_mib']:>12.0f}{result['state_bytes'] / 1024:>11.0f}"
                      f"{result['seconds']:>14.2f}")


if __name__ == "__main__":
    main()
