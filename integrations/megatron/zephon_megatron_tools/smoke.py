"""CPU smoke training: megatron-core's GPTModel and DDP on gloo, fed by the adapter.

Megatron-LM's ``pretrain()`` needs CUDA, so this module plays its part on CPU with the very
same adapter objects the Megatron-LM entry hands to ``pretrain()``: the command line is parsed
by the adapter's parser (Megatron's flag names), :class:`~zephon_megatron.provider.
ZephonDatasetsProvider` builds the iterators on tensor-parallel rank 0 and restores/checks the
loader state on resume, and :func:`~zephon_megatron.loss.make_forward_step` (get_batch + the
per-token loss) runs every microbatch. What stands in for Megatron-LM:

- a loop of ``global_batch_size / (micro_batch_size * dp)`` microbatches per step, gradients
  finalized by megatron-core's ``finalize_model_grads`` with the step's token count (the
  ``--calculate-per-token-loss`` path), then a plain ``torch.optim.AdamW`` step on the
  gradients DDP reduced into ``main_grad`` (Megatron's optimizer wrapper needs CUDA);
- checkpoints: the model and optimizer (rank 0), ``latest_checkpointed_iteration.txt``, and
  each reader's loader state in the file layout of Megatron-LM's ``--dataloader-save``.

CUDA-only calls are shimmed by :mod:`zephon_megatron_tools.cpu_shims`, nowhere else. Every rank is a
subprocess (``RANK``/``WORLD_SIZE``, gloo on 127.0.0.1). Each reader logs, per microbatch, its
global index and tokens to ``trace_<tag>_rank<r>.json``; rank 0 writes the per-step losses to
``summary_<tag>.json``. Usage::

    python -m zephon_megatron_tools.smoke --nproc 2 --workdir /tmp/smoke [-- <Megatron flags>]

Exit status 0 when every rank finished and, with ``--check-loss``, the loss fell.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from zephon.distributed import launcher_store

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "megatron" / "pretrain_packed.toml"
DEFAULT_MEGATRON_FLAGS = [
    "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
    "--calculate-per-token-loss", "--transformer-impl", "local", "--train-iters", "12",
    "--eval-iters", "0", "--eval-interval", "12", "--dataloader", "zephon",
    "--zephon-lanes", "8", "--zephon-recipe", str(RECIPE),
]


def smoke_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m zephon_megatron_tools.smoke", allow_abbrev=False,
        description="CPU smoke training of megatron-core with the zephon adapter. Megatron "
        "flags go after '--' (default: " + " ".join(DEFAULT_MEGATRON_FLAGS[:-1]) + " ...).")
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel processes")
    parser.add_argument("--workdir", default="smoke-megatron", help="checkpoints, traces")
    parser.add_argument("--tag", default="run", help="names this run's trace/summary files")
    parser.add_argument("--save-at", type=int, default=None, help="checkpoint after step K")
    parser.add_argument("--resume", action="store_true",
                        help="load the latest checkpoint in --workdir")
    parser.add_argument("--check-loss", action="store_true",
                        help="fail unless the mean loss of the last 3 steps is below the "
                        "first 3")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for all ranks")
    parser.add_argument("--write-indexed-demo", metavar="DIR", default=None,
                        help="write the demo corpus as two Megatron indexed datasets "
                        "(DIR/web_text_document, DIR/code_text_document; EOD after every "
                        "document, as preprocess_data.py --append-eod does), print their "
                        "prefixes and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def write_indexed_demo(directory: str) -> list[str]:
    """The demo corpus, tokenized with the demo tokenizer, as two indexed datasets of
    different document lengths; returns their prefixes. Also prints the vocabulary size."""
    import numpy as np

    from zephon.demo.assets import build_demo_assets, make_documents
    from zephon.io.indexed import write_indexed_dataset
    from zephon.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(build_demo_assets()["tokenizer"])
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    prefixes = []
    for name, seed, words in (("web", 31, (20, 120)), ("code", 32, (80, 300))):
        texts = make_documents(300, seed=seed, min_words=words[0], max_words=words[1])
        ids = [np.array(tokenizer(t, add_special_tokens=False)["input_ids"] +
                        [tokenizer.eos_token_id], dtype=np.int32) for t in texts]
        prefixes.append(write_indexed_dataset(out / f"{name}_text_document", ids,
                                              dtype=np.uint16))
    print(" ".join(prefixes), f"vocab_size={len(tokenizer)}")
    return prefixes


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, list(DEFAULT_MEGATRON_FLAGS)


# -- worker ------------------------------------------------------------------------------------
class TracingIterator:
    """Passes microbatches through and records what the trainer consumed."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.records: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        data = next(self.inner)
        digest = hashlib.sha256()
        for key in sorted(data):
            digest.update(key.encode())
            digest.update(data[key].contiguous().numpy().tobytes())
        self.records.append({"global_microbatch": self.inner.last_global_microbatch,
                             "tokens": data["tokens"].tolist(), "digest": digest.hexdigest()})
        return data


def _padded_vocab(args: argparse.Namespace, settings: Any) -> int:
    """Megatron pads the vocabulary to a multiple of 128: of ``--vocab-size`` when given,
    else of the recipe tokenizer's size."""
    from zephon.text.tokenizer import load_tokenizer
    from zephon_megatron.arguments import training_recipes

    size = args.vocab_size
    if size is None:
        tokenizer = training_recipes(settings)["train"].tokenizer
        if tokenizer is None:
            raise SystemExit("zephon_megatron_tools.smoke: token-id data (--data-path) needs "
                             "--vocab-size")
        size = len(load_tokenizer(tokenizer))
    return -(-size // 128) * 128


def run_worker(options: argparse.Namespace, megatron_argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from zephon_megatron.arguments import build_standalone_parser, settings_from_args
    from zephon_megatron.loss import make_forward_step
    from zephon_megatron.provider import ZephonDatasetsProvider
    from zephon_megatron.state_files import write_dataloader_state
    from zephon_megatron_tools import cpu_shims

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args = build_standalone_parser().parse_args(megatron_argv)
    workdir = Path(options.workdir)
    args.save = args.save or str(workdir / "checkpoints")
    args.dataloader_save = args.dataloader_save or str(workdir / "dataloader")
    args.load = args.load or (args.save if options.resume else None)
    settings = settings_from_args(args)  # fails before any process group exists
    args.padded_vocab_size = _padded_vocab(args, settings)

    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(args.tensor_model_parallel_size, 1)
    cpu_shims.install(args.seed)
    config = TransformerConfig(
        num_layers=options.layers, hidden_size=options.hidden,
        num_attention_heads=options.heads, use_cpu_initialization=True,
        pipeline_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        calculate_per_token_loss=True,
        tensor_model_parallel_size=args.tensor_model_parallel_size)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=args.padded_vocab_size,
                     max_sequence_length=args.seq_length, position_embedding_type="rope")
    model = DistributedDataParallel(
        config, DistributedDataParallelConfig(overlap_grad_reduce=False), model)
    model.broadcast_params()
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr)

    args.iteration, args.consumed_train_samples = 0, 0
    if args.load:
        tracker = Path(args.load) / "latest_checkpointed_iteration.txt"
        args.iteration = int(tracker.read_text())
        blob = torch.load(Path(args.load) / f"iter_{args.iteration:07d}" / "smoke_model.pt",
                          weights_only=True)
        model.module.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        args.consumed_train_samples = blob["consumed_train_samples"]

    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    reader = parallel_state.get_tensor_model_parallel_rank() == 0
    writer = None
    # Megatron-LM's writer stands in, on the last rank as Megatron-LM has it (the console
    # line comes from data-parallel rank 0).
    if args.tensorboard_dir and rank == world - 1:
        from torch.utils.tensorboard import SummaryWriter

        from zephon_megatron.step_metrics import set_writer

        writer = SummaryWriter(args.tensorboard_dir)
        set_writer(writer)
    train = None
    if reader:
        train, _, _ = ZephonDatasetsProvider(lambda: args)(None)
    traced = TracingIterator(train) if train is not None else None
    forward_step = make_forward_step(lambda: args)
    microbatches = args.global_batch_size // (args.micro_batch_size * dp_size)
    losses: list[float] = []
    started = time.monotonic()
    for step in range(args.iteration, args.train_iters):
        model.train()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        loss_sum = torch.zeros([])
        tokens = torch.zeros([], dtype=torch.int)
        for _ in range(microbatches):
            output, loss_fn = forward_step(traced, model)
            loss, count, _ = loss_fn(output)
            loss.backward()
            loss_sum += loss.detach()
            tokens += count
        reduced = torch.stack([loss_sum, tokens.float()])
        dist.all_reduce(reduced, group=parallel_state.get_data_parallel_group())
        finalize_model_grads([model], tokens.clone())
        for param in model.parameters():  # DDP reduces into main_grad, as Megatron's optimizer
            param.grad = param.main_grad  # reads it
        optimizer.step()
        args.consumed_train_samples += args.global_batch_size
        losses.append(float(reduced[0] / reduced[1]))
        if rank == 0:
            print(f"step {step + 1}/{args.train_iters} loss {losses[-1]:.4f} "
                  f"tokens {int(reduced[1])}", flush=True)
        if options.save_at is not None and step + 1 == options.save_at:
            _save(args, step + 1, model, optimizer, train, dp_rank, rank == 0,
                  write_dataloader_state)
    if writer is not None:
        writer.close()
    if traced is not None:
        out = workdir / f"trace_{options.tag}_rank{rank}.json"
        out.write_text(json.dumps(traced.records))
    if rank == 0:
        summary = {"nproc": world, "dp_size": dp_size, "losses": losses,
                   "start_iteration": args.iteration, "train_iters": args.train_iters,
                   "seconds": time.monotonic() - started}
        (workdir / f"summary_{options.tag}.json").write_text(json.dumps(summary))
    dist.barrier()
    # Tear down in order: objects holding process groups first, then the groups themselves.
    if train is not None:
        train.summarize()
        train.close()
    del model, optimizer, train, traced
    gc.collect()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _save(args: argparse.Namespace, iteration: int, model: Any, optimizer: Any, train: Any,
          dp_rank: int, is_first: bool, write_dataloader_state: Any) -> None:
    import torch
    import torch.distributed as dist

    if train is not None:
        write_dataloader_state(args.dataloader_save, iteration, dp_rank, train.save_state())
    if is_first:
        target = Path(args.save) / f"iter_{iteration:07d}"
        target.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "consumed_train_samples": args.consumed_train_samples},
                   target / "smoke_model.pt")
        (Path(args.save) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    dist.barrier()


# -- launcher ----------------------------------------------------------------------------------
def launch(options: argparse.Namespace, own_argv: list[str], megatron_argv: list[str]) -> int:
    """Start ``--nproc`` ranks and wait; stop the rest as soon as one fails."""
    Path(options.workdir).mkdir(parents=True, exist_ok=True)
    _store, rendezvous = launcher_store(options.nproc)  # hosts the rendezvous until the ranks exit
    env = {**os.environ, **rendezvous, "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore::UserWarning"}
    command = [sys.executable, "-m", "zephon_megatron_tools.smoke", "--worker", *own_argv, "--",
               *megatron_argv]
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(r)})
             for r in range(options.nproc)]
    deadline = time.monotonic() + options.timeout
    status = 0
    while any(p.poll() is None for p in ranks):
        failed = [p for p in ranks if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            status = failed[0].returncode if failed else 124
            for p in ranks:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    for p in ranks:
        p.wait()
        status = status or p.returncode
    return status


def check_loss(workdir: str, tag: str) -> str | None:
    """None when the loss fell (mean of the last 3 steps below the first 3), else why not."""
    losses = json.loads((Path(workdir) / f"summary_{tag}.json").read_text())["losses"]
    if len(losses) < 10:
        return f"only {len(losses)} steps ran; the smoke check wants at least 10"
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    if not last < first:
        return f"the loss did not fall: first steps {first:.4f}, last steps {last:.4f}"
    print(f"smoke-megatron: loss {first:.4f} -> {last:.4f} over {len(losses)} steps")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    own_argv, megatron_argv = split_argv(sys.argv[1:] if argv is None else argv)
    options = smoke_parser().parse_args(own_argv)
    if options.write_indexed_demo:
        write_indexed_demo(options.write_indexed_demo)
        return 0
    if options.worker:
        run_worker(options, megatron_argv)
        return 0
    from zephon_megatron.arguments import build_standalone_parser, settings_from_args
    try:  # fail before any process starts, naming the flag or recipe
        args = build_standalone_parser().parse_args(megatron_argv)
        settings_from_args(args, world_size=options.nproc)
    except ValueError as exc:
        print(f"smoke-megatron: {exc}", file=sys.stderr)
        return 2
    status = launch(options, own_argv, megatron_argv)
    if status != 0:
        print(f"smoke-megatron: a rank failed (exit status {status})", file=sys.stderr)
        return status
    if options.check_loss:
        problem = check_loss(options.workdir, options.tag)
        if problem:
            print(f"smoke-megatron: {problem}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
