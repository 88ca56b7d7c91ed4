"""Megatron-LM's own ``pretrain()`` on CPU with ``--dataloader zephon``: the adapter's real path.

``python -m zephon_megatron_tools.cpu_pretrain --nproc N [--trace DIR] [--script PATH] --
<Megatron flags>`` starts ``N`` ranks on gloo (127.0.0.1), each applying
:func:`zephon_megatron_tools.cpu_shims.install_for_pretrain` and running
:func:`zephon_megatron.pretrain_gpt.main` (or your own ``pretrain_gpt.py``, ``--script``) with
:data:`CPU_FLAGS` added: Megatron-LM's initialization, training loop, evaluation, optimizer and
checkpoints run as on a cluster, only on a tiny fp32 model. It needs a Megatron-LM checkout
(``megatron.training``, ``gpt_builders``, ``model_provider``, ``pretrain_gpt``) on
``PYTHONPATH`` and ``six`` and ``triton`` (the ``megatron-training`` extra); without one it exits
with status 2 saying so, as the entry does.

``--trace DIR``: every rank writes ``DIR/trace_rank<r>.json``, the global index and a SHA-256
of each training microbatch it handed to Megatron, so two runs can be compared token for token
(tests resume at another data-parallel size and compare with an uninterrupted run).

Model parameters are created on the CPU (``--use-cpu-initialization``). A run of a 2-layer
model spends most of its time on imports (measured: docs/measurements.md); not a benchmark.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zephon.distributed import launcher_store
from zephon_megatron.flags import split_command_line

CPU_FLAGS = ("--distributed-backend", "gloo", "--use-cpu-initialization",
             "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
             "--no-rope-fusion", "--transformer-impl", "local")
"""What a CPU run of Megatron-LM needs: gloo, parameters made on the CPU, no fused CUDA
kernels (RoPE's included, for ``--position-embedding-type rope``), megatron-core's local
layers (no Transformer Engine). fp32: no --bf16/--fp16."""


def _trace_training_microbatches(directory: Path, rank: int) -> None:
    from zephon_megatron.provider import ZephonDataIterator

    records: list[dict[str, Any]] = []
    handed = ZephonDataIterator.__next__

    def traced(self: ZephonDataIterator) -> Any:
        out = handed(self)
        if self.role == "train":
            digest = hashlib.sha256()
            for key in sorted(out):
                digest.update(key.encode())
                digest.update(out[key].contiguous().numpy().tobytes())
            records.append({"global_microbatch": self.last_global_microbatch,
                            "digest": digest.hexdigest()})
        return out

    ZephonDataIterator.__next__ = traced  # type: ignore[method-assign]

    @atexit.register
    def write() -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"trace_rank{rank}.json").write_text(json.dumps(records))


def worker(flags: list[str], trace: str | None, script: str | None = None) -> int:
    from zephon_megatron.pretrain_gpt import main, missing_megatron_lm, missing_message, report

    missing = missing_megatron_lm()
    if missing:
        report(missing_message(missing))
        return 2
    from zephon_megatron_tools import cpu_shims

    cpu_shims.install_for_pretrain()
    if trace:
        _trace_training_microbatches(Path(trace), int(os.environ["RANK"]))
    if script:  # your own pretrain_gpt.py, run as its own __main__
        import runpy

        sys.argv = [script, *flags, *CPU_FLAGS]
        sys.path.insert(0, str(Path(script).resolve().parent))
        runpy.run_path(script, run_name="__main__")
        return 0
    return main([*flags, *CPU_FLAGS])


def launch(nproc: int, flags: Sequence[str], *, trace: str | None = None,
           timeout: float = 600.0, script: str | None = None) -> int:
    """Run ``nproc`` ranks; rank 0 and the last rank (Megatron logs iterations there) print,
    the others' output is shown only on failure."""
    _store, rendezvous = launcher_store(nproc)  # hosts the rendezvous until the ranks exit
    procs = []
    for rank in range(nproc):
        env = {**os.environ, **rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(nproc), "OMP_NUM_THREADS": "1",
               "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        command = [sys.executable, "-m", "zephon_megatron_tools.cpu_pretrain", "--worker",
                   *(["--trace", trace] if trace else []),
                   *(["--script", script] if script else []), "--", *flags]
        shown = rank in (0, nproc - 1)
        procs.append(subprocess.Popen(command, env=env, text=True,
                                      stdout=None if shown else subprocess.PIPE,
                                      stderr=None if shown else subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    codes = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            print(f"cpu_pretrain: rank {rank} did not finish in {timeout:.0f} s",
                  file=sys.stderr)
            return 1
        codes.append(proc.returncode)
        if proc.returncode and out:
            print(f"--- rank {rank} ---\n{out[-4000:]}", file=sys.stderr)
    return next((code for code in codes if code), 0)


def main(argv: Sequence[str] | None = None) -> int:
    own, flags = split_command_line(argv)
    parser = argparse.ArgumentParser(prog="python -m zephon_megatron_tools.cpu_pretrain",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel ranks (gloo)")
    parser.add_argument("--trace", default=None, metavar="DIR",
                        help="write each rank's training microbatch digests here")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--script", default=None, metavar="PATH",
                        help="run this pretrain_gpt.py of your own instead of the entry "
                        "(zephon_megatron.pretrain_gpt)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(own)
    if options.worker:
        return worker(flags, options.trace, options.script)
    return launch(options.nproc, flags, trace=options.trace, timeout=options.timeout,
                  script=options.script)


if __name__ == "__main__":
    raise SystemExit(main())
