"""GPU checks for CUDA machines with Transformer Engine:
``python -m zephon_megatron_tools.gpu_check``.

1. THD equivalence: a tiny megatron-core GPTModel with the Transformer Engine layer spec runs a
   packed microbatch from the document-masking recipe through the adapter's get_batch
   (``PackedSeqParams(qkv_format="thd")``, 1-D cu_seqlens over the whole microbatch); each
   document's logits must match the document run alone (bf16 tolerance). As a control, the
   same tokens without the packed parameters must differ for some later document, showing
   the comparison can fail.
2. ``pretrain()``: with a Megatron-LM checkout importable (or ``--megatron-lm PATH``), runs
   ``torchrun -m zephon_megatron.pretrain_gpt ... --dataloader zephon`` for a few steps with
   evaluation on (``--eval-interval``, the validation recipe) and a checkpoint whose loader
   state lives in ``--save``, then resumes from it for two more steps (the loader state is
   restored and checked against ``consumed_train_samples``), on every GPU of the node and,
   with two or more, resumed on half of them (another data-parallel size).

``--dry-run`` checks on any machine, CPU included, that every command line check 2 would run
passes Megatron-LM's own parser and ``validate_args`` (of the installed megatron.training, or
``--megatron-lm PATH``) and the adapter's launch checks, and prints them. Without CUDA or
Transformer Engine a plain run prints what is missing and exits 0 (nothing to check on this
machine); a failed check exits 1. It runs briefly on one GPU (measured: docs/measurements.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[3] / "recipes" / "megatron"


def unavailable() -> str | None:
    """Why the checks cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    if importlib.util.find_spec("transformer_engine") is None:
        return "Transformer Engine is not installed (pip install transformer_engine[pytorch])"
    return None


def _settings(seq: int, mbs: int):
    from zephon_megatron.arguments import build_standalone_parser, settings_from_args

    args = build_standalone_parser().parse_args([
        "--seq-length", str(seq), "--micro-batch-size", str(mbs), "--calculate-per-token-loss",
        "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
        "--transformer-impl", "transformer_engine", "--dataloader", "zephon",
        "--zephon-recipe", str(RECIPES / "pretrain_packed.toml"), "--zephon-prefetch", "0"])
    return settings_from_args(args)


def check_thd_equivalence(seq: int = 512, mbs: int = 2) -> str:
    """Run check 1; returns a one-line result, raises AssertionError on a mismatch."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    from zephon.recipe import DataRecipe
    from zephon_megatron.get_batch import TensorParallel, get_batch
    from zephon_megatron.provider import Topology, build_iterator

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(num_layers=2, hidden_size=128, num_attention_heads=4,
                               bf16=True, params_dtype=torch.bfloat16,
                               pipeline_dtype=torch.bfloat16, hidden_dropout=0.0,
                               attention_dropout=0.0)
    spec = get_gpt_layer_with_transformer_engine_spec()
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=4096,
                     max_sequence_length=seq, position_embedding_type="rope").cuda().eval()
    settings = _settings(seq, mbs)
    iterator = build_iterator(DataRecipe.from_toml(settings.recipe), settings, Topology())
    device = torch.device("cuda", 0)
    worst, documents, differs = 0.0, 0, 0
    with torch.no_grad():
        for _ in range(4):
            batch = get_batch(iterator, attention="thd", tp=TensorParallel(), device=device)
            packed = model(batch.tokens, batch.position_ids, None,
                           packed_seq_params=batch.packed_seq_params)[0]
            crossing = model(batch.tokens, batch.position_ids, None)[0]
            bounds = batch.cu_seqlens.tolist()
            for start, end in itertools.pairwise(bounds):
                alone = model(batch.tokens[:, start:end],
                              batch.position_ids[:, start:end] - batch.position_ids[0, start],
                              None)[0]
                scale = float(alone.abs().max()) + 1e-3
                diff = float((packed[start:end] - alone).abs().max()) / scale
                worst = max(worst, diff)
                documents += 1
                if start % seq and float((crossing[start:end] - alone).abs().max()) / scale > 0.05:
                    differs += 1
    assert worst < 0.02, f"THD packed logits differ from documents alone by {worst:.4f}"
    assert differs > 0, "control failed: attention across documents changed nothing"
    parallel_state.destroy_model_parallel()
    return (f"THD equivalence: {documents} documents, max relative difference {worst:.4f}; "
            f"{differs} later documents differ without PackedSeqParams (control)")


def pretrain_commands(work: str, steps: int = 4, gpus: int = 1) -> list[tuple[int, list[str]]]:
    """(processes, Megatron flags) of check 2: train ``steps`` iterations on ``gpus``
    processes with evaluation and a checkpoint, then resume for two more on ``gpus // 2`` (or
    1). The loader state goes into the checkpoint (no ``--dataloader-save``); lanes are 8, so
    the global batch size of 16 rows splits over 1, 2, 4 or 8 readers."""
    base = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
            "--seq-length", "512", "--max-position-embeddings", "512",
            "--micro-batch-size", "2", "--global-batch-size", "16", "--lr", "1e-3",
            "--bf16", "--position-embedding-type", "rope", "--log-interval", "1",
            "--eval-interval", "2", "--eval-iters", "1", "--calculate-per-token-loss",
            "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
            "--transformer-impl", "transformer_engine", "--dataloader", "zephon",
            "--zephon-lanes", "8", "--zephon-recipe", str(RECIPES / "pretrain_packed.toml"),
            "--zephon-valid-recipe", str(RECIPES / "validation.toml"),
            "--save", f"{work}/ckpt", "--save-interval", str(steps)]
    gpus = max(1, min(gpus, 8))
    return [(gpus, [*base, "--train-iters", str(steps)]),
            (max(1, gpus // 2), [*base, "--train-iters", str(steps + 2),
                                 "--load", f"{work}/ckpt"])]


def _with_megatron_lm(env: dict[str, str], megatron_lm: str | None) -> dict[str, str]:
    if megatron_lm:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [megatron_lm,
                                                          env.get("PYTHONPATH")]))
    return env


def _pretrain(nproc: int, flags: list[str],
              env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", "29534", "-m", "zephon_megatron.pretrain_gpt", *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def check_pretrain(megatron_lm: str | None, steps: int = 4) -> str:
    """Run check 2; returns a one-line result, raises AssertionError when a run fails."""
    import torch

    env = _with_megatron_lm(dict(os.environ), megatron_lm)
    with tempfile.TemporaryDirectory(prefix="zephon-gpu-check-") as work:
        (first_n, first_flags), (second_n, second_flags) = pretrain_commands(
            work, steps, torch.cuda.device_count())
        first = _pretrain(first_n, first_flags, env)
        assert first.returncode == 0, f"pretrain() failed:\n{first.stdout[-3000:]}\n" \
                                      f"{first.stderr[-3000:]}"
        assert "lm loss" in first.stdout + first.stderr, "pretrain() logged no lm loss"
        assert "validation loss" in first.stdout + first.stderr, "no evaluation ran"
        states = list(Path(work, "ckpt").rglob("train_dataloader_dprank*.pt"))
        assert len(states) == first_n, f"{len(states)} loader states for {first_n} readers"
        second = _pretrain(second_n, second_flags, env)
        assert second.returncode == 0, f"resume failed:\n{second.stdout[-3000:]}\n" \
                                       f"{second.stderr[-3000:]}"
    return (f"pretrain(): {steps} steps on {first_n} GPU(s) with evaluation, loader state in "
            f"the checkpoint, resumed on {second_n} for 2 more steps")


def dry_run(megatron_lm: str | None = None, gpus: int = 2) -> list[str]:
    """Check every command line of check 2 against Megatron-LM's parser and validate_args
    and the adapter's launch checks, in a fresh interpreter per command (Megatron's parser
    reads ``sys.argv`` and global state). Returns one line per command; raises
    AssertionError naming the command that fails."""
    env = _with_megatron_lm(dict(os.environ), megatron_lm)
    lines = []
    for nproc, flags in pretrain_commands("/tmp/zephon-gpu-check", gpus=gpus):
        command = [sys.executable, "-m", "zephon_megatron_tools.gpu_check", "--parse-only",
                   str(nproc), "--", *flags]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (f"Megatron-LM refused {' '.join(flags)}:\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        lines.append(done.stdout.strip().splitlines()[-1])
    return lines


def parse_with_megatron(nproc: int, flags: list[str]) -> str:
    """Megatron-LM's parse_args and validate_args over ``flags`` at ``nproc`` ranks, then the
    adapter's settings; a one-line summary."""
    from megatron.training.arguments import parse_args, validate_args  # noqa: I001

    from zephon_megatron.arguments import make_extra_args_provider, settings_from_args
    from zephon_megatron.pretrain_gpt import zephon_args_defaults

    import torch
    from megatron.training import arguments

    if not torch.cuda.is_available() and hasattr(arguments, "get_device_arch_version"):
        # validate_args asks for the GPU generation with tensor parallelism; on a CPU-only
        # machine the dry run answers for the Hopper GPUs of a typical node.
        arguments.get_device_arch_version = lambda: 9
    os.environ.update(WORLD_SIZE=str(nproc), RANK="0")
    sys.argv = ["pretrain_gpt", *flags]
    args = parse_args(make_extra_args_provider("zephon"))
    settings = settings_from_args(args, world_size=nproc)
    validate_args(args, zephon_args_defaults(settings, flags))
    return (f"ok: {nproc} rank(s), data-parallel {args.data_parallel_size}, lanes "
            f"{settings.lanes}, eval every {args.eval_interval} x {args.eval_iters}, "
            f"loader state in {settings.dataloader_save or settings.dataloader_load}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zephon_megatron_tools.gpu_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", default=None, help="Megatron-LM checkout directory")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip-pretrain", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="check check 2's command lines with Megatron-LM's parser (any "
                        "machine)")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs the dry run plans for")
    parser.add_argument("--parse-only", type=int, default=None, help=argparse.SUPPRESS)
    options, rest = parser.parse_known_args(argv)
    if options.parse_only is not None:
        print(parse_with_megatron(options.parse_only, [a for a in rest if a != "--"]))
        return 0
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if options.dry_run:
        try:
            for line in dry_run(options.megatron_lm, options.gpus):
                print("gpu_check: dry run:", line)
        except AssertionError as exc:
            print(f"gpu_check: dry run FAILED: {exc}", file=sys.stderr)
            return 1
        return 0
    reason = unavailable()
    if reason:
        print(f"gpu_check: {reason}; nothing to check here. Run it on a GPU node with "
              "Transformer Engine (and a Megatron-LM checkout for the pretrain() check).")
        return 0
    try:
        print("gpu_check:", check_thd_equivalence(), flush=True)
        from zephon_megatron.pretrain_gpt import missing_megatron_lm

        if options.skip_pretrain:
            print("gpu_check: pretrain() check skipped (--skip-pretrain)")
        elif options.megatron_lm is None and missing_megatron_lm():
            print("gpu_check: pretrain() check skipped: no Megatron-LM checkout (pass "
                  "--megatron-lm PATH or put it on PYTHONPATH)")
        else:
            print("gpu_check:", check_pretrain(options.megatron_lm, options.steps))
    except AssertionError as exc:
        print(f"gpu_check: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
