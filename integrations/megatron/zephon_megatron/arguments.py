"""Command-line layer: Megatron flags plus the adapter's own, checked against the data recipe.

:func:`add_zephon_args` is the ``extra_args_provider`` for Megatron-LM's ``pretrain()``: it adds
``--dataloader {megatron,zephon}`` (``megatron`` stays the default), ``--zephon-recipe``,
``--zephon-valid-recipe``, ``--zephon-test-recipe``, ``--zephon-lanes``, ``--zephon-prefetch``
and, because Megatron-LM only reads it, ``--dataloader-save``. Megatron's own flags keep their
meaning or are refused before the model is built: :data:`zephon_megatron.flags.TABLE` says
what each data flag of Megatron-LM does here (the README carries the same table, and a test
checks both against Megatron-LM's parser); the refused ones are refused by name
(:func:`~zephon_megatron.flags.refused_flag_problems`).

Lanes: a recipe's ``lanes``, else ``--zephon-lanes``, else (on resume) the lanes of the loader
state, else ``DEFAULT_LANES_PER_READER`` (8) times the data-parallel size of the first launch.
Later launches resume exactly at any data-parallel size dividing that number: started at 12
readers (96 lanes), a run goes on at 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48 or 96 readers.

Megatron's switches are store-true flags, so "absent" and "off" are the same thing. A recipe
that leaves one of these choices open takes it from the flags; a recipe that states it must
agree with them, or :func:`settings_from_args` raises :class:`ZephonArgumentError` naming the
flag, the recipe file and the key. Everything is checked before a model is built.

:func:`add_megatron_data_flags` declares the subset of Megatron-LM's flags the adapter reads,
with Megatron's names, destinations and defaults, so the CPU smoke run and the tests parse the
same command lines without a Megatron-LM checkout (the tests compare it with Megatron's parser
where one is present).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.integration import LaneChoice, choose_lanes
from zephon_megatron.adapter_error import ZephonArgumentError
from zephon_megatron.flags import add_refused_flags, refused_flag_problems
from zephon_megatron.geometry import data_parallel_size, rampup
from zephon_megatron.preset import MEGATRON, PRESET_LAYOUT
from zephon_megatron.state_files import saved_lanes, state_directories

log = logging.getLogger(__name__)

DATALOADERS = ("megatron", "zephon")
ATTENTION_BY_IMPL = {"transformer_engine": "thd", "local": "dense"}
_PER_SPLIT_FLAGS = (("train", "train_data_path", "--train-data-path"),
                    ("valid", "valid_data_path", "--valid-data-path"),
                    ("test", "test_data_path", "--test-data-path"))
DATA_SOURCES = ("--zephon-recipe PATH (a data recipe), --data-path or --data-args-path "
                "(Megatron indexed datasets, cut by --split), or --per-split-data-args-path / "
                "--train-data-path (a blend per split)")


@dataclass(frozen=True)
class MaskingChoices:
    """The to_training choices of a run, as Megatron's flags and the recipe agreed on them."""

    position_mode: str
    """``"preserve"`` (positions restart per document) or ``"sequence"`` (0..S-1 per row)."""
    document_masking: bool
    """Tokens attend only within their document (cu_seqlens / dense document mask)."""
    eos_mask_loss: bool
    """The label predicted from an EOS token (the next document's first) is ignored."""


@dataclass(frozen=True)
class ZephonSettings:
    """Everything the provider, the iterators and get_batch need from the command line."""

    recipe: str | None
    valid_recipe: str | None
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None
    lanes: int
    prefetch: int | None
    masking: MaskingChoices
    attention: str
    """``"thd"`` (Transformer Engine, PackedSeqParams) or ``"dense"`` (local attention)."""
    dataloader_save: str | None
    """Where Megatron writes the loader state with each checkpoint: ``--dataloader-save``, else
    the checkpoint directory ``--save`` itself."""
    data_path: tuple[str, ...] | None = None
    """Megatron's ``--data-path`` blend (or the values of ``--data-args-path``), when the data
    comes from it (see :mod:`zephon_megatron.blend`); ``recipe`` then holds only options, or is
    empty."""
    per_split: tuple[tuple[str, ...] | None, ...] | None = None
    """The train, valid and test blends of ``--per-split-data-args-path`` or
    ``--train-data-path``/``--valid-data-path``/``--test-data-path`` (None: no data)."""
    split: str | None = None
    """Megatron's ``--split`` for a ``--data-path`` blend."""
    seed: int = 1234
    log_interval: int | None = None
    """Megatron's ``--log-interval``: iterations between loader metrics."""
    dataloader_load: str | None = None
    """Where a resume reads the loader state: ``--dataloader-save``, else ``--load``."""
    test_recipe: str | None = None
    """``--zephon-test-recipe``: the test evaluation's data (None: no test)."""
    workers: int | None = None
    """``--num-workers`` when given: document-operator processes per reader."""
    trace_dir: str | None = None
    """``--zephon-trace-dir``: where each reader writes a line per training microbatch."""
    rampup_batch_size: tuple[int, int, int] | None = None
    """``--rampup-batch-size START INCREMENT SAMPLES``: the global batch size grows from START
    to ``--global-batch-size`` (the iteration numbers of the metrics follow it)."""
    decrease_batch_size_if_needed: bool = False
    """``--decrease-batch-size-if-needed``: Megatron rounds the global batch size down to a
    multiple of micro batch x data-parallel size."""
    train_iters: int | None = None
    """``--train-iters``: the iteration whose last microbatch ends training."""
    train_samples: int | None = None
    """``--train-samples``: training ends at the iteration that consumes them."""


# -- parsers -----------------------------------------------------------------------------------
def add_zephon_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron ``extra_args_provider``: the adapter's flags (see the module docstring)."""
    group = parser.add_argument_group("zephon", "Zephon data loader (zephon_megatron)")
    group.add_argument("--dataloader", choices=DATALOADERS, default="megatron",
                       help="Data loader: Megatron's GPTDataset (default) or Zephon.")
    group.add_argument("--zephon-recipe", default=None, metavar="PATH",
                       help="Zephon data recipe (TOML) for training; needs --dataloader zephon.")
    group.add_argument("--zephon-valid-recipe", default=None, metavar="PATH",
                       help="Zephon data recipe for validation; every evaluation reads the "
                       "same first microbatches of it.")
    group.add_argument("--zephon-test-recipe", default=None, metavar="PATH",
                       help="Zephon data recipe for the test evaluation after training "
                       "(absent: Megatron plans no test).")
    group.add_argument("--zephon-lanes", type=int, default=None, metavar="L",
                       help="Lanes of the run (fixed across resumes; any data-parallel size "
                       "dividing L gives the same data). Must agree with the recipe's lanes.")
    group.add_argument("--zephon-trace-dir", default=None, metavar="DIR",
                       help="Write one JSON line per training microbatch to DIR/rank<r>.jsonl "
                       "(global microbatch, lane, record ids, SHA-256 of the tensors): what "
                       "`zephon trace` lists for a step.")
    group.add_argument("--zephon-prefetch", type=int, default=None, metavar="N",
                       help="0 runs the loader on the training thread; positive (the "
                       "default) reads ahead on a background thread, within the recipe's "
                       "read_ahead_tokens.")
    if "--dataloader-save" not in parser._option_string_actions:
        group.add_argument("--dataloader-save", default=None, metavar="DIR",
                           help="Directory for the loader state written with every checkpoint "
                           "and read on resume (one file per data-parallel rank).")
    return parser


def make_extra_args_provider(dataloader: str) -> Callable[[argparse.ArgumentParser],
                                                          argparse.ArgumentParser]:
    """The provider for ``pretrain()``; with zephon, ``--dataloader-type`` defaults to external
    (Megatron then hands the provider's iterators to the training loop as they are)."""

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        add_zephon_args(parser)
        if dataloader == "zephon":
            # num_workers: None tells a given --num-workers from Megatron's default.
            parser.set_defaults(dataloader_type="external", num_workers=None)
        return parser

    return provider


def add_megatron_data_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The Megatron-LM flags the adapter reads, spelled and defaulted as Megatron-LM does."""
    group = parser.add_argument_group("megatron (subset read by zephon_megatron)")
    add = group.add_argument
    add("--seq-length", type=int, default=None)
    add("--micro-batch-size", type=int, default=None)
    add("--global-batch-size", type=int, default=None)
    add("--rampup-batch-size", nargs=3, default=None)
    add("--decrease-batch-size-if-needed", action="store_true")
    add("--reset-position-ids", action="store_true")
    add("--reset-attention-mask", action="store_true")
    add("--dataloader-inter-document-masking", action="store_true")
    add("--eod-mask-loss", action="store_true")
    add("--no-create-attention-mask-in-dataloader", action="store_false",
        dest="create_attention_mask_in_dataloader")
    add("--calculate-per-token-loss", action="store_true")
    add("--transformer-impl", type=str, default="transformer_engine",
        choices=["local", "transformer_engine", "inference_optimized"])
    add("--dataloader-type", type=str, default=None, choices=["single", "cyclic", "external"])
    add("--data-path", nargs="*", default=None)
    add("--data-args-path", type=str, default=None)
    add("--per-split-data-args-path", type=str, default=None)
    add("--split", type=str, default=None)
    add("--num-workers", type=int, default=2)
    add("--data-cache-path", default=None)
    add("--vocab-size", type=int, default=None)
    add("--train-data-path", nargs="*", default=None)
    add("--valid-data-path", nargs="*", default=None)
    add("--test-data-path", nargs="*", default=None)
    add("--mock-data", action="store_true")
    add("--tensor-model-parallel-size", type=int, default=1)
    add("--pipeline-model-parallel-size", type=int, default=1)
    add("--context-parallel-size", type=int, default=1)
    add("--full-validation", action="store_true")
    add("--seed", type=int, default=1234)
    add("--train-iters", type=int, default=None)
    add("--train-samples", type=int, default=None)
    add("--eval-iters", type=int, default=100)
    add("--eval-interval", type=int, default=None)
    add("--load", type=str, default=None)
    add("--save", type=str, default=None)
    add("--save-interval", type=int, default=None)
    add("--log-interval", type=int, default=100)
    add("--tensorboard-dir", type=str, default=None)
    add("--ckpt-step", type=int, default=None)
    add("--finetune", action="store_true")
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--padded-vocab-size", type=int, default=None)
    add("--null-tokenizer-eod-id", type=int, default=None)
    add("--no-pad-vocab-size", action="store_false", dest="pad_vocab_size")
    add_refused_flags(parser)
    return parser


def build_standalone_parser() -> argparse.ArgumentParser:
    """Megatron's data flags plus the adapter's, for runs without Megatron-LM (smoke, tests)."""
    parser = argparse.ArgumentParser(description="zephon_megatron", allow_abbrev=False)
    parser = add_zephon_args(add_megatron_data_flags(parser))
    # Megatron's tokenizer, for the early checks (choices differ between Megatron versions).
    parser.add_argument("--tokenizer-type", type=str, default=None)
    parser.add_argument("--tokenizer-model", type=str, default=None)
    parser.set_defaults(num_workers=None)
    return parser


# -- validation --------------------------------------------------------------------------------
def resolve_masking(to_training: dict[str, Any], source: str, *, reset_position_ids: bool,
                    reset_attention_mask: bool, eod_mask_loss: bool) -> MaskingChoices:
    """Agree Megatron's three masking flags with a recipe's ``[to_training]`` table."""
    wanted = MaskingChoices("preserve" if reset_position_ids else "sequence",
                            reset_attention_mask, eod_mask_loss)
    checks = (
        ("position_mode", wanted.position_mode, "--reset-position-ids",
         "per-document positions ('preserve')", reset_position_ids),
        ("return_cu_seqlens", wanted.document_masking, "--reset-attention-mask",
         "document masking (return_cu_seqlens = true)", reset_attention_mask),
        ("eos_mask_loss", wanted.eos_mask_loss, "--eod-mask-loss",
         "masking the label after EOS (eos_mask_loss = true)", eod_mask_loss),
    )
    for key, value, flag, meaning, given in checks:
        if key in to_training and to_training[key] != value:
            state = "given" if given else "absent"
            raise ZephonArgumentError(
                f"{source}: [to_training] {key} = {to_training[key]!r} conflicts with {flag} "
                f"({state}): Megatron spells {meaning} as {flag}. Make the flag and the recipe "
                f"agree, or drop {key} from the recipe to let the flag decide.")
    for key in PRESET_LAYOUT:
        if to_training.get(key):
            raise ZephonArgumentError(
                f"{source}: [to_training] {key} is fixed by the Megatron adapter (tokens, "
                "labels, loss_mask, position_ids, cu_seqlens, max_seqlen); remove it")
    if wanted.position_mode == "preserve" and not wanted.document_masking:
        log.warning("zephon_megatron: --reset-position-ids without --reset-attention-mask: "
                    "positions restart per document but tokens still attend across documents")
    return wanted


def _load_recipe(path: str, flag: str) -> Any:
    from zephon.recipe import load_recipe

    if not Path(path).is_file():
        raise ZephonArgumentError(f"{flag} {path!r}: no such file")
    return load_recipe(path, preset=MEGATRON)


def _agree_recipe(recipe: Any, name: str, value: Any, flag: str, given: Any) -> None:
    if value is not None and given is not None and value != given:
        raise ZephonArgumentError(f"{recipe.source}: {name} = {value} conflicts with {flag} "
                                  f"{given}; remove it from the recipe or make them agree")


def check_megatron_dataloader(args: argparse.Namespace) -> None:
    """With ``--dataloader megatron`` the adapter's data flags would be ignored: refuse them."""
    for name in ("zephon_recipe", "zephon_valid_recipe", "zephon_test_recipe", "zephon_lanes",
                 "zephon_prefetch"):
        if getattr(args, name, None) is not None:
            flag = "--" + name.replace("_", "-")
            raise ZephonArgumentError(f"{flag} is only read with --dataloader zephon")


def settings_from_args(args: argparse.Namespace,
                       world_size: int | None = None) -> ZephonSettings:
    """Validate a parsed command line for ``--dataloader zephon`` and preflight its recipes
    against the run (:mod:`zephon_megatron.args_checks`; ``world_size`` defaults to
    ``WORLD_SIZE``); raise naming every problem."""
    if getattr(args, "dataloader", "megatron") != "zephon":
        check_megatron_dataloader(args)
        raise ZephonArgumentError("settings_from_args needs --dataloader zephon")
    data_path, per_split = data_sources(args)
    if not args.zephon_recipe and not data_path and per_split is None:
        raise ZephonArgumentError(f"--dataloader zephon needs {DATA_SOURCES}")
    blended = bool(data_path) or per_split is not None
    test_recipe = getattr(args, "zephon_test_recipe", None)
    if blended and (args.zephon_valid_recipe or test_recipe):
        flag = "--zephon-valid-recipe" if args.zephon_valid_recipe else "--zephon-test-recipe"
        where = "--split" if data_path else "the per-split blends"
        raise ZephonArgumentError(f"{flag} conflicts with Megatron's data flags: "
                                  f"validation and test come from {where}")
    if getattr(args, "split", None) and not data_path:
        raise ZephonArgumentError("--split is only read with --data-path or --data-args-path; "
                                  "per-split blends and a recipe's validation data "
                                  "(--zephon-valid-recipe) are not cut")
    if args.dataloader_type not in (None, "external"):
        raise ZephonArgumentError(f"--dataloader-type {args.dataloader_type} conflicts with "
                                  "--dataloader zephon, which needs --dataloader-type external "
                                  "(the default with --dataloader zephon)")
    for dest, flag in (("seq_length", "--seq-length"), ("micro_batch_size",
                                                        "--micro-batch-size")):
        value = getattr(args, dest, None)
        if not isinstance(value, int) or value < 1:
            raise ZephonArgumentError(f"--dataloader zephon needs {flag} (a positive integer), "
                                      f"got {value!r}")
    if not getattr(args, "calculate_per_token_loss", False):
        raise ZephonArgumentError(
            "--dataloader zephon needs --calculate-per-token-loss: packed rows carry different "
            "numbers of trained tokens, and only a per-token mean keeps padding and masked "
            "labels from diluting the loss")
    if getattr(args, "context_parallel_size", 1) > 1:
        raise ZephonArgumentError("--context-parallel-size > 1 is not supported by "
                                  "--dataloader zephon yet")
    if getattr(args, "full_validation", False):
        raise ZephonArgumentError("--full-validation needs a sized validation set; "
                                  "--dataloader zephon streams, use --eval-iters")
    impl = getattr(args, "transformer_impl", "transformer_engine")
    if impl not in ATTENTION_BY_IMPL:
        raise ZephonArgumentError(f"--transformer-impl {impl} is not supported by --dataloader "
                                  f"zephon (use one of {sorted(ATTENTION_BY_IMPL)})")
    if args.zephon_prefetch is not None and args.zephon_prefetch < 0:
        raise ZephonArgumentError("--zephon-prefetch must be >= 0")
    workers = getattr(args, "num_workers", None)
    if workers is not None and workers < 0:
        raise ZephonArgumentError(f"--num-workers must be >= 0, got {workers}")
    if getattr(args, "data_cache_path", None):
        raise ZephonArgumentError(
            "--data-cache-path names Megatron's index cache, which --dataloader zephon does not "
            "build; Hub shards are cached as the recipe's [cache] says. Remove "
            "--data-cache-path")
    _check_evaluation_flags(args)

    if args.zephon_recipe and not Path(args.zephon_recipe).is_file():
        raise ZephonArgumentError(f"--zephon-recipe {args.zephon_recipe!r}: no such file")
    for flag, path in (("--zephon-valid-recipe", args.zephon_valid_recipe),
                       ("--zephon-test-recipe", test_recipe)):
        if path and not Path(path).is_file():
            raise ZephonArgumentError(f"{flag} {path!r}: no such file")
    recipes = load_recipes(args.zephon_recipe, args.zephon_valid_recipe, data_path,
                           getattr(args, "split", None), args.zephon_lanes,
                           int(getattr(args, "seed", 1234)), test_recipe,
                           seq_length=args.seq_length, per_split=per_split)
    recipe = recipes["train"]
    if args.zephon_lanes is not None and args.zephon_lanes < 1:
        raise ZephonArgumentError("--zephon-lanes must be >= 1")
    dataloader_save, dataloader_load = state_directories(args)
    # From here on every problem of the recipes is collected and reported at once.
    problems: list[str] = []

    def collect(check: Callable[[], Any], default: Any = None) -> Any:
        try:
            return check()
        except ZephonArgumentError as exc:
            problems.append(str(exc))
            return default

    def masking_of(r: Any) -> MaskingChoices:
        return resolve_masking(r.to_training, r.source,
                               reset_position_ids=args.reset_position_ids,
                               reset_attention_mask=args.reset_attention_mask or getattr(
                                   args, "dataloader_inter_document_masking", False),
                               eod_mask_loss=args.eod_mask_loss)

    masking = collect(lambda: masking_of(recipe))
    collect(lambda: _check_shapes(recipe, args))
    lanes = recipe.lanes
    lanes_from = f"lanes = {lanes} in {recipe.source}"
    if args.zephon_lanes is not None:
        collect(lambda: _agree_recipe(recipe, "lanes", recipe.lanes, "--zephon-lanes",
                                      args.zephon_lanes))
        lanes, lanes_from = args.zephon_lanes, f"--zephon-lanes {args.zephon_lanes}"
    if lanes is None:
        choice = lane_choice(args, dataloader_load, world_size)
        lanes, lanes_from = choice.lanes, f"{choice.lanes} lanes ({choice.why})"
    if int(getattr(args, "eval_iters", 0) or 0) > 0 and recipes["valid"] is None:
        where = ("--split gives validation no share" if data_path
                 else "the per-split blends give validation no data" if per_split is not None
                 else "there is no --zephon-valid-recipe")
        problems.append(
            f"--eval-iters {args.eval_iters} plans evaluation, but {where}; Megatron would "
            "stop at the first evaluation. Give validation data, or --eval-iters 0")
    for valid in (recipes["valid"], recipes["test"]):
        if valid is None:
            continue
        collect(lambda valid=valid: _agree_recipe(valid, "lanes", valid.lanes,
                                                  "the training lanes", lanes))
        collect(lambda valid=valid: masking_of(valid))
        collect(lambda valid=valid: _check_shapes(valid, args))
    from zephon_megatron.args_checks import batch_problems, recipe_problems

    problems += refused_flag_problems(args)
    ramp = collect(lambda: rampup(args))
    problems += batch_problems(args, world_size, ramp)
    problems += recipe_problems(args, recipes, lanes, world_size, lanes_from)
    if len(problems) == 1:
        raise ZephonArgumentError(problems[0])
    if problems:
        raise ZephonArgumentError("zephon preflight found problems before the model is built:\n"
                                  + "\n".join(f"  - {p}" for p in problems))
    return ZephonSettings(
        recipe=args.zephon_recipe, valid_recipe=args.zephon_valid_recipe,
        seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
        global_batch_size=getattr(args, "global_batch_size", None), lanes=lanes,
        prefetch=args.zephon_prefetch, masking=masking, attention=ATTENTION_BY_IMPL[impl],
        dataloader_save=dataloader_save,
        data_path=tuple(data_path) if data_path else None, split=getattr(args, "split", None),
        per_split=per_split,
        seed=int(getattr(args, "seed", 1234)),
        log_interval=getattr(args, "log_interval", None), dataloader_load=dataloader_load,
        test_recipe=test_recipe, workers=workers,
        trace_dir=getattr(args, "zephon_trace_dir", None),
        rampup_batch_size=rampup(args),
        decrease_batch_size_if_needed=bool(getattr(args, "decrease_batch_size_if_needed",
                                                   False)),
        train_iters=getattr(args, "train_iters", None),
        train_samples=getattr(args, "train_samples", None))


def data_sources(args: argparse.Namespace
                 ) -> tuple[list[str] | None, tuple[tuple[str, ...] | None, ...] | None]:
    """(``--data-path`` values, per-split blends) of a command line, as Megatron-LM reads them
    (``get_blend_and_blend_per_split``): ``--data-args-path`` holds the ``--data-path``
    values; ``--per-split-data-args-path`` (else ``--train-data-path``,
    ``--valid-data-path``, ``--test-data-path``) gives a blend per split. One source only."""
    from zephon_megatron.blend import read_data_args, read_per_split_data_args

    if getattr(args, "mock_data", False):
        raise ZephonArgumentError("--mock-data conflicts with --dataloader zephon: the data "
                                  f"comes from {DATA_SOURCES}")
    data_path = getattr(args, "data_path", None) or None
    args_path = getattr(args, "data_args_path", None)
    split_file = getattr(args, "per_split_data_args_path", None)
    split_flags = [flag for _, dest, flag in _PER_SPLIT_FLAGS if getattr(args, dest, None)]
    given = (["--data-path"] if data_path else []) + (["--data-args-path"] if args_path else []) \
        + (["--per-split-data-args-path"] if split_file else []) + split_flags[:1]
    if len(given) > 1:
        raise ZephonArgumentError(f"{given[0]} conflicts with {given[1]}: Megatron reads one "
                                  "source of data; give one of them")
    try:
        if args_path:
            return read_data_args(args_path), None
        if split_file:
            blends = read_per_split_data_args(split_file)
            return None, tuple(tuple(blends[role]) if blends[role] else None
                               for role, _, _ in _PER_SPLIT_FLAGS)
    except ConfigError as exc:
        raise ZephonArgumentError(str(exc)) from None
    if split_flags:
        if not getattr(args, "train_data_path", None):
            raise ZephonArgumentError(f"{split_flags[0]} needs --train-data-path too: the "
                                      "training data of a blend per split")
        return None, tuple(tuple(getattr(args, dest)) if getattr(args, dest, None) else None
                           for _, dest, _ in _PER_SPLIT_FLAGS)
    return data_path, None


def _check_evaluation_flags(args: argparse.Namespace) -> None:
    if getattr(args, "train_iters", None) and getattr(args, "eval_interval", None) is None:
        raise ZephonArgumentError(
            "--train-iters needs --eval-interval: Megatron-LM 0.16 computes train_iters // "
            "eval_interval while it builds the data, even with --eval-iters 0. Pass "
            "--eval-interval N (and --eval-iters 0 to evaluate never)")
    interval = getattr(args, "eval_interval", None)
    if interval is not None and interval < 1:
        raise ZephonArgumentError(f"--eval-interval must be >= 1, got {interval}")


def lane_choice(args: argparse.Namespace, state_dir: str | None,
                world_size: int | None) -> LaneChoice:
    """Lanes when neither the recipe nor ``--zephon-lanes`` sets them, and why: the saved
    run's lanes on resume, else ``DEFAULT_LANES_PER_READER`` x this launch's data-parallel
    size."""
    saved = None
    if state_dir and getattr(args, "load", None):
        saved = saved_lanes(state_dir, args.load, getattr(args, "ckpt_step", None))
    return choose_lanes(data_parallel_size(args, world_size), saved=saved)


def load_recipes(recipe: str | None, valid_recipe: str | None,
                 data_path: Sequence[str] | None, split: str | None, lanes: int | None,
                 seed: int, test_recipe: str | None = None, *, seq_length: int,
                 per_split: Sequence[Sequence[str] | None] | None = None) -> dict[str, Any]:
    """``{"train", "valid", "test"}`` recipes (valid/test may be None): from the recipe files,
    or from a ``--data-path`` or per-split blend (see :mod:`zephon_megatron.blend`; unweighted
    prefixes are weighed by their samples of ``seq_length``)."""
    if data_path or per_split is not None:
        from zephon_megatron.blend import SPLITS, blend_recipes

        blends = dict(zip(SPLITS, per_split, strict=True)) if per_split is not None else None
        try:
            return blend_recipes(data_path, split, recipe, lanes=lanes, seed=seed,
                                 seq_length=seq_length, per_split=blends)
        except ZephonArgumentError:
            raise
        except ConfigError as exc:
            raise ZephonArgumentError(str(exc)) from None
    train = _load_recipe(recipe, "--zephon-recipe")
    valid = _load_recipe(valid_recipe, "--zephon-valid-recipe") if valid_recipe else None
    test = _load_recipe(test_recipe, "--zephon-test-recipe") if test_recipe else None
    return {"train": train, "valid": valid, "test": test}


def training_recipes(settings: ZephonSettings) -> dict[str, Any]:
    """The recipes ``settings`` were checked with, read again (on every reader)."""
    return load_recipes(settings.recipe, settings.valid_recipe, settings.data_path,
                        settings.split, settings.lanes, settings.seed, settings.test_recipe,
                        seq_length=settings.seq_length, per_split=settings.per_split)


def _check_shapes(recipe: Any, args: argparse.Namespace) -> None:
    pack = recipe.pack
    if pack is None or not pack.flat:
        raise ZephonArgumentError(f"{recipe.source}: Megatron needs fixed-length rows; set "
                                  "[pack] with flat packing (pack_flat)")
    # [pack] max_length and [batch] microbatch_size against the flags: see the preflight.
    if not recipe.batch.drop_last:
        raise ZephonArgumentError(f"{recipe.source}: [batch] drop_last = false gives short "
                                  "microbatches; Megatron needs --micro-batch-size rows in each")
