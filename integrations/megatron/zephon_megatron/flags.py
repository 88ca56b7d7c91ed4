"""Every data-related flag of Megatron-LM and what it does with ``--dataloader zephon``.

Megatron-LM declares its data flags in four argument groups (``_add_data_args``'s "data and
dataloader", "tokenizer", "checkpointing" and "sft"); :data:`TABLE` lists every flag of those
groups in megatron-core 0.16 and 0.19, plus the flags of other groups the adapter reads. Each
flag has one of three verdicts:

- :data:`READ`: the adapter reads it, with Megatron's meaning;
- :data:`MEGATRON`: Megatron-LM acts on it as it does with its own loader (the model, its
  tokenizer, the model checkpoint) and the loader needs nothing from it; flags that only
  Megatron's own datasets read (BERT, T5, FIM) and that mean nothing for GPT data say so;
- :data:`REFUSED`: it would have no effect on Zephon's loader, so a run that sets it (to
  anything but Megatron's default) is refused before the model is built, naming the flag and
  what to use instead (:func:`refused_flag_problems`).

The adapter's README carries the same table (``tests/megatron/test_megatron_flags.py`` checks
both against the installed Megatron-LM's parser, so a flag a new version adds fails the test
until it is listed here).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

READ = "read"
MEGATRON = "Megatron's"
REFUSED = "refused"

MEGATRON_GROUPS = ("data and dataloader", "tokenizer", "checkpointing", "sft")
"""The argument groups of Megatron-LM's parser whose every flag :data:`TABLE` must list."""


@dataclass(frozen=True)
class Refusal:
    """How to tell that a refused flag was given: its destination and Megatron's default."""

    dest: str
    default: Any
    kind: str = "value"
    """``"true"`` (store_true), ``"false"`` (store_false) or ``"value"`` (takes a value)."""
    type: Any = str


_MODEL_CHECKPOINT = ("the model checkpoint; the loader state is written into every checkpoint "
                     "(per data-parallel rank) whatever it says")
_TOKENIZER = ("Megatron's tokenizer, built by Megatron (the loader checks its EOD and size "
              "against the data)")
_OTHER_DATASETS = "read only by Megatron's BERT/T5 datasets: nothing for GPT data"
_FIM = "read only with --fim-data, which is refused"
_NO_INDEX = ("Zephon builds no index cache: it reads each dataset's sizes from its .idx header "
             "and its tokens from the memory-mapped .bin. Remove it")

TABLE: dict[str, tuple[str, str]] = {
    # -- data and dataloader -------------------------------------------------------------------
    "--data-path": (READ, "the blend: weights and indexed-dataset prefixes, or prefixes "
                          "weighted by size (zephon_megatron.blend)"),
    "--split": (READ, "each dataset's train/valid/test documents, Megatron's rounding "
                      "(default 969,30,1)"),
    "--train-data-path": (READ, "the training blend of a per-split run"),
    "--valid-data-path": (READ, "the validation blend of a per-split run"),
    "--test-data-path": (READ, "the test blend of a per-split run"),
    "--data-args-path": (READ, "a file holding the --data-path values"),
    "--per-split-data-args-path": (READ, "a JSON file of train/valid/test blends"),
    "--per-dataset-sequences-path": (REFUSED, _NO_INDEX),
    "--phase-transition-iterations": (REFUSED, "a run reads one blend; to change it, start a "
                                               "new run (a resume refuses another blend)"),
    "--dataloader-fast-cache-load": (REFUSED, _NO_INDEX),
    "--dataloader-defer-npy-index-mmap": (REFUSED, _NO_INDEX),
    "--data-cache-path": (REFUSED, "Zephon builds no index cache (Hub shards are cached as "
                                   "the recipe's [cache] says). Remove it"),
    "--no-mmap-bin-files": (REFUSED, "Zephon always memory-maps .bin files. Remove it"),
    "--mock-data": (REFUSED, "give data: --data-path, a per-split blend or --zephon-recipe"),
    "--seq-length": (READ, "rows are packed to seq_length + 1 tokens"),
    "--encoder-seq-length": (MEGATRON, "the model's; the loader packs to --seq-length, which "
                                       "it needs"),
    **dict.fromkeys(("--decoder-seq-length", "--sample-rate", "--mask-prob",
                     "--short-seq-prob"),
                    (MEGATRON, _OTHER_DATASETS)),
    "--num-workers": (READ, "processes per reader running the document operators"),
    "--reset-position-ids": (READ, "positions restart at every document"),
    "--reset-attention-mask": (READ, "document masking (cu_seqlens, or a dense mask with "
                                     "local attention)"),
    "--dataloader-inter-document-masking": (READ, "0.19's name for document masking: the "
                                                  "same"),
    "--eod-mask-loss": (READ, "the label after each EOD is not trained (EOD from the "
                              "tokenizer, checked against the data's document ends)"),
    "--no-create-attention-mask-in-dataloader": (READ, "no [b, 1, s, s] causal mask is made "
                                                       "either way: the adapter's get_batch "
                                                       "gives what the attention needs"),
    "--num-dataset-builder-threads": (REFUSED, _NO_INDEX),
    "--object-storage-cache-path": (REFUSED, "Zephon reads object stores through the "
                                             "recipe's datasets and [cache], with no index "
                                             "cache. Remove it"),
    "--mid-level-dataset-surplus": (REFUSED, "Zephon's blend takes no surplus: it mixes "
                                             "tokens as it goes. Remove it"),
    "--allow-ambiguous-pad-tokens": (REFUSED, "Zephon masks the padding it adds by position, "
                                              "never by id. Remove it"),
    "--fim-data": (REFUSED, "fill-in-the-middle data is not made by Zephon; remove it, or "
                            "train on data written in FIM form"),
    **dict.fromkeys(("--fim-rate", "--fim-spm-rate", "--fim-split-sample",
                     "--fim-fragment-rate", "--fim-no-prefix", "--fim-prefix-token",
                     "--fim-middle-token", "--fim-suffix-token", "--fim-pad-token",
                     "--fim-eod-token"),
                    (MEGATRON, _FIM)),
    # -- sft -----------------------------------------------------------------------------------
    "--sft": (REFUSED, "Megatron's SFT dataset is not emulated: give chat data through a "
                       "--zephon-recipe with [tokenize] kind = \"chat\" (recipes/megatron/"
                       "sft_chat.toml), which trains on the assistant turns only"),
    "--sft-tokenizer-prompt-format": (MEGATRON, "Megatron's SFTTokenizer prompt format"),
    # -- tokenizer -----------------------------------------------------------------------------
    "--vocab-size": (READ, "NullTokenizer's size; with token-id data the model's vocabulary "
                           "bounds every id"),
    "--padded-vocab-size": (READ, "the model's vocabulary, the bound of every token id"),
    "--no-pad-vocab-size": (READ, "the model's vocabulary is the tokenizer's, unpadded"),
    **dict.fromkeys(("--vocab-file", "--merge-file", "--vocab-extra-ids"),
                    (MEGATRON, _TOKENIZER)),
    "--tokenizer-type": (READ, "Megatron's tokenizer: its EOD for --eod-mask-loss, its size "
                               "for the vocabulary"),
    "--tokenizer-model": (READ, "Megatron's tokenizer (a Hugging Face directory is checked "
                                "against the recipe's tokenizer before the model is built)"),
    **dict.fromkeys(("--tokenizer-metadata", "--tokenizer-special-tokens",
                     "--legacy-tokenizer", "--tiktoken-pattern",
                     "--tiktoken-num-special-tokens", "--tiktoken-special-tokens",
                     "--tokenizer-sentencepiece-legacy",
                     "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
                     "--tokenizer-hf-use-fast", "--tokenizer-hf-no-use-fast",
                     "--tokenizer-hf-include-special-tokens",
                     "--tokenizer-hf-no-include-special-tokens", "--trust-remote-code"),
                    (MEGATRON, _TOKENIZER)),
    "--chat-template": (MEGATRON, _TOKENIZER + "; a chat recipe's [tokenize] template is the "
                                               "one the data is made with"),
    "--null-tokenizer-eod-id": (READ, "NullTokenizer's EOD, the id --eod-mask-loss masks "
                                      "after"),
    "--null-tokenizer-pad-id": (MEGATRON, _TOKENIZER),
    # -- checkpointing -------------------------------------------------------------------------
    "--save": (READ, "the loader state is written into each checkpoint "
                     "(iter_N/mp_rank_*/train_dataloader_dprank*.pt)"),
    "--load": (READ, "a resume reads every rank's loader state from the checkpoint"),
    "--ckpt-step": (READ, "the iteration a resume reads (the preflight checks that one)"),
    "--finetune": (READ, "Megatron starts at iteration 0 with no consumed samples, so the "
                         "loader starts at the beginning of its data"),
    "--override-ckpt-iteration": (REFUSED, "the loader state is that of the checkpoint's "
                                           "iteration; resume from another iteration with "
                                           "--ckpt-step"),
    **dict.fromkeys(("--exit-on-missing-checkpoint", "--ckpt-format",
                     "--auto-detect-ckpt-format", "--pretrained-checkpoint",
                     "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args",
                     "--no-use-tokenizer-model-from-checkpoint-args"),
                    (MEGATRON, _MODEL_CHECKPOINT)),
}
for _flag in (
        "--save-interval", "--save-wgrads-interval", "--save-dgrads-interval",
        "--save-retain-interval", "--save-activations-interval", "--save-params-interval",
        "--save-tokens-per-expert-interval", "--load-main-params-from-ckpt",
        "--non-persistent-save-interval", "--non-persistent-ckpt-type",
        "--non-persistent-global-ckpt-dir", "--non-persistent-local-ckpt-dir",
        "--non-persistent-local-ckpt-algo", "--ckpt-convert-format", "--ckpt-convert-save",
        "--ckpt-convert-update-legacy-dist-opt-format", "--no-ckpt-fully-parallel-save",
        "--async-save", "--async-strategy", "--async-ckpt-cpu-priority",
        "--async-ckpt-io-priority", "--async-ckpt-use-cpu-shm", "--use-persistent-ckpt-worker",
        "--ckpt-fully-parallel-load", "--ckpt-fully-parallel-load-exchange-algo",
        "--ckpt-fully-parallel-load-process-group", "--ckpt-fully-parallel-save-process-group",
        "--ckpt-assume-constant-structure", "--no-strict-fsdp-dtensor-load",
        "--dist-ckpt-strictness", "--dist-ckpt-save-pre-mcore-014",
        "--dist-ckpt-optim-fully-reshardable", "--distrib-optim-fully-reshardable-mem-efficient",
        "--dist-ckpt-workers", "--no-ckpt-load-validate-sharding-integrity",
        "--no-stream-ckpt-dequant", "--verify-integrity", "--replication", "--replication-jump",
        "--replication-factor", "--no-save-optim", "--no-save-rng", "--no-load-optim",
        "--no-load-rng", "--use-dist-ckpt", "--dist-ckpt-format", "--ckpt-fully-parallel-save"):
    TABLE[_flag] = (MEGATRON, _MODEL_CHECKPOINT)

ALSO_READ: dict[str, tuple[str, str]] = {k: (READ, v) for k, v in {
    "--micro-batch-size": "rows per microbatch",
    "--global-batch-size": "microbatches per step: micro batch x data-parallel size must "
                           "divide it (checked before the model)",
    "--rampup-batch-size": "the batch-size ramp: the loader metrics' and "
                           "zephon_megatron_tools.trace's iterations follow it",
    "--decrease-batch-size-if-needed": "as Megatron rounds the global batch size",
    "--train-iters": "with --train-samples, the data a run needs (checked when it does not "
                     "repeat)",
    "--train-samples": "see --train-iters",
    "--eval-iters": "iterations per evaluation; > 0 needs validation data",
    "--eval-interval": "required with --train-iters (Megatron-LM 0.16 divides by it)",
    "--dataloader-type": "external (the default with --dataloader zephon); others are refused",
    "--seed": "the data's seed (a recipe's seed wins)",
    "--calculate-per-token-loss": "required: packed rows carry different numbers of trained "
                                  "tokens",
    "--transformer-impl": "transformer_engine: THD cu_seqlens; local: a dense document mask",
    "--tensor-model-parallel-size": "with pipeline and context parallel sizes, the "
                                    "data-parallel size",
    "--make-vocab-size-divisible-by": "Megatron's padding of the vocabulary",
    "--log-interval": "the loader metrics' interval",
}.items()}
ALSO_READ["--full-validation"] = (REFUSED, "validation streams --eval-iters batches from the "
                                           "same start each time; use --eval-iters")
ALSO_READ["--context-parallel-size"] = (REFUSED, "values above 1 are not supported yet")
"""Flags of other groups the adapter reads (or refuses), with what they do here."""

REFUSALS: dict[str, Refusal] = {
    "--per-dataset-sequences-path": Refusal("per_dataset_sequences_path", None),
    "--phase-transition-iterations": Refusal("phase_transition_iterations", None),
    "--dataloader-fast-cache-load": Refusal("dataloader_fast_cache_load", False, "true"),
    "--dataloader-defer-npy-index-mmap": Refusal("dataloader_defer_npy_index_mmap", False,
                                                 "true"),
    "--no-mmap-bin-files": Refusal("mmap_bin_files", True, "false"),
    "--num-dataset-builder-threads": Refusal("num_dataset_builder_threads", 1, type=int),
    "--object-storage-cache-path": Refusal("object_storage_cache_path", None),
    "--mid-level-dataset-surplus": Refusal("mid_level_dataset_surplus", 0.005, type=float),
    "--allow-ambiguous-pad-tokens": Refusal("allow_ambiguous_pad_tokens", False, "true"),
    "--fim-data": Refusal("fim_data", False, "true"),
    "--sft": Refusal("sft", False, "true"),
    "--override-ckpt-iteration": Refusal("override_ckpt_iteration", None, type=int),
}
"""The refused flags the generic check finds (``--mock-data`` and ``--data-cache-path`` are
refused with the data sources, see :mod:`zephon_megatron.arguments`)."""


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Declare the refused flags as Megatron-LM does, for runs without its parser."""
    group = parser.add_argument_group("megatron flags refused by zephon_megatron")
    for flag, refusal in REFUSALS.items():
        if flag in parser._option_string_actions:
            continue
        if refusal.kind == "true":
            group.add_argument(flag, dest=refusal.dest, action="store_true")
        elif refusal.kind == "false":
            group.add_argument(flag, dest=refusal.dest, action="store_false")
        else:
            group.add_argument(flag, dest=refusal.dest, type=refusal.type,
                               default=refusal.default)


def refused_flag_problems(args: argparse.Namespace) -> list[str]:
    """One problem per refused flag this command line sets, naming what to use instead."""
    problems = []
    for flag, refusal in REFUSALS.items():
        value = getattr(args, refusal.dest, refusal.default)
        if value != refusal.default:
            shown = flag if refusal.kind != "value" else f"{flag} {value}"
            problems.append(f"{shown} has no effect with --dataloader zephon: "
                            f"{TABLE[flag][1]}")
    return problems


def markdown_table() -> str:
    """The README's table: one row per flag read or refused, one per meaning of the flags
    Megatron keeps to itself (every flag of :data:`TABLE` and :data:`ALSO_READ`)."""
    lines = ["| flag | with `--dataloader zephon` |", "| --- | --- |"]
    kept: dict[str, list[str]] = {}
    for flag, (verdict, meaning) in [*TABLE.items(), *ALSO_READ.items()]:
        if verdict == MEGATRON:
            kept.setdefault(meaning, []).append(flag)
        else:
            lines.append(f"| `{flag}` | {verdict}: {meaning} |")
    for meaning, flags in kept.items():
        lines.append(f"| {', '.join(f'`{f}`' for f in flags)} | {MEGATRON}: {meaning} |")
    return "\n".join(lines)


def split_command_line(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """A tool's own arguments and, after ``--``, the Megatron flags it passes on (``argv``
    None: ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    return args[:cut], args[cut + 1:]

