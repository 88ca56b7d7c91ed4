"""The data recipes checked against a Megatron run before ``pretrain()`` builds the model.

:func:`~zephon_megatron.arguments.settings_from_args` runs :func:`recipe_problems` on the
training, validation and test recipes wherever it reads a command line: in the entry
(``python -m zephon_megatron.pretrain_gpt``, before Megatron-LM is imported), in the CPU smoke
run (before any process starts) and in the provider. It lists every problem with the others
of the command line: fields in every file, tokenizer vs ``--vocab-size``, lanes vs the
data-parallel size, ``[pack] max_length`` vs ``--seq-length + 1``, ``[batch]
microbatch_size`` vs ``--micro-batch-size``. The data-parallel size is ``world_size /
(tensor x pipeline x context parallel)``, ``world_size`` from ``WORLD_SIZE`` unless given.

Then, where the recipes are sound, what Megatron-LM or the resume would otherwise trip on
after the model is built:

- batch sizes (:func:`batch_problems`): ``--global-batch-size`` must be a multiple of
  ``--micro-batch-size`` x data-parallel size (megatron-core's
  ``ConstantNumMicroBatchesCalculator``); with ``--rampup-batch-size START INCREMENT SAMPLES``
  (megatron-core <= 0.18, which applies the ramp) every batch size of the ramp must be too,
  i.e. START and INCREMENT. ``--decrease-batch-size-if-needed`` rounds them down instead;
  then only a batch size below one microbatch per reader is refused.
- the amount of training data (:func:`data_shortfall`): a dataset that does not repeat can run
  out before ``--train-iters`` (or ``--train-samples``): the samples Megatron's loop consumes,
  the ramp included, against the rows the data yields
  (:mod:`zephon.integration.data_amount`, counted for one indexed dataset, else estimated).
- Megatron-LM's tokenizer (:func:`tokenizer_problems`), where it loads without Megatron-LM:
  ``--tokenizer-type HuggingFaceTokenizer`` with a local ``--tokenizer-model`` directory. It
  must have at least the ids of the recipe's tokenizer and end documents with the same EOS id
  (:func:`~zephon_megatron.tokenizer_checks.check_tokenizers` runs again in the provider as a
  backstop, and checks the other tokenizer types after Megatron-LM built them).
- ``--eod-mask-loss`` on token-id data (:func:`~zephon_megatron.eod_checks.eod_problems`):
  an EOD id Megatron's NullTokenizer would make up is refused; an EOD the documents of an
  indexed dataset never end with is refused, naming the ids they end with.
- token ids of ``--data-path`` data against ``--vocab-size`` (:func:`token_id_problems`): the
  ``.idx`` dtype bounds them (uint8/uint16 data cannot exceed a vocabulary of 256/65536 or
  more: nothing is read); otherwise the ``.bin`` is scanned, a vectorized max over a memmap of
  each dataset in chunks (at memory speed from the page cache; a first read from disk at the
  disk's speed; measured: docs/measurements.md).
- a resume (:func:`resume_problems`): the loader state the resume would read must have been
  written by the same pipeline. Its fingerprint (lanes, seed, datasets, operators) is compared
  with this recipe's by :func:`zephon.engine.loader_state.check_fingerprint`, the function the
  restore itself uses, so the message is the restore's; ``--micro-batch-size`` too.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import Any

from zephon.integration import indexed_prefixes
from zephon_megatron.eod_checks import eod_problems
from zephon_megatron.geometry import data_parallel_size, model_ways, rampup
from zephon_megatron.state_files import (
    checkpoint_iteration,
    read_dataloader_states,
    state_directories,
)
from zephon_megatron.tokenizer_checks import check_tokenizers

FLAGS = {"seq_len": "--seq-length", "microbatch_size": "--micro-batch-size",
         "vocab_size": "--vocab-size"}
"""The Megatron flags behind each run value, named in conflicts."""


def recipe_problems(args: argparse.Namespace, recipes: dict[str, Any], lanes: int | None,
                    world_size: int | None = None, lanes_from: str | None = None) -> list[str]:
    """Every problem of ``recipes`` (train/valid/test; None skipped) in this run; where the
    recipes have none, the training data against the run (see the module docstring).
    ``lanes_from`` says where the lanes came from (the recipe, ``--zephon-lanes``, the
    checkpoint, the default), for the message when the readers cannot share them."""
    from zephon.integration import FrameworkValues, check_recipe, lanes_problem

    dp = data_parallel_size(args, world_size)
    problems: list[str] = []
    shared = lanes_problem(lanes, dp) if lanes is not None else None
    if shared:
        problems.append(f"{lanes_from or f'{lanes} lanes'}: {shared}")
    seen: set[int] = set()
    for role, recipe in recipes.items():
        if recipe is None or id(recipe) in seen:
            continue  # the test split may read the validation recipe again
        seen.add(id(recipe))
        values = FrameworkValues(seq_len=args.seq_length, microbatch_size=args.micro_batch_size,
                                 dp_size=None, lanes=lanes, flags=dict(FLAGS),
                                 vocab_size=getattr(args, "vocab_size", None))
        for problem in check_recipe(recipe, values=values):
            problems.append(f"[{role}] {problem}")
    if problems or lanes is None or recipes.get("train") is None:
        return problems
    problems += tokenizer_problems(args, recipes["train"])
    problems += token_id_problems(args, recipes["train"])
    problems += eod_problems(args, recipes["train"])
    if problems:
        return problems
    pipeline = None
    if _needs_pipeline(args):
        from zephon.errors import ConfigError, DataError

        try:
            pipeline = build_pipeline(recipes["train"], args, lanes)
        except (ConfigError, DataError) as exc:
            return [f"[train] {exc}"]
    if pipeline is not None:
        problems += resume_problems(args, pipeline, recipes["train"])
        if not problems:
            short = data_shortfall(args, recipes["train"], pipeline, dp)
            if short:
                problems.append(f"[train] {short}")
    return problems


def _needs_pipeline(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "train_iters", None) or getattr(args, "train_samples", None)
                or resume_iteration(args) is not None)


def build_pipeline(recipe: Any, args: argparse.Namespace, lanes: int) -> Any:
    """The training pipeline of rank 0 (not iterated): its fingerprint and estimates. The
    recipe is read as the provider reads it (:func:`~zephon_megatron.vocabulary.run_recipe`),
    so the fingerprint is the one the run's loader state holds."""
    from zephon_megatron.vocabulary import run_recipe

    return run_recipe(recipe, args).build(seq_len=args.seq_length,
                                          microbatch_size=args.micro_batch_size,
                                          lanes=lanes, prefetch=0, workers=0)


# -- tokenizers and token ids -----------------------------------------------------------------
class HuggingFaceTokenizer:
    """What the provider's checks read of Megatron-LM's HuggingFaceTokenizer: its EOD."""

    def __init__(self, eod: int | None):
        self.eod = eod


def tokenizer_problems(args: argparse.Namespace, recipe: Any) -> list[str]:
    """Megatron's ``--tokenizer-model`` (a local Hugging Face directory) against the recipe's
    tokenizer: as many ids at least, the same EOS."""
    model = getattr(args, "tokenizer_model", None)
    if recipe.tokenizer is None or getattr(args, "tokenizer_type", None) != \
            "HuggingFaceTokenizer" or not model or not os.path.isdir(os.path.expanduser(model)):
        return []
    from zephon.errors import ConfigError
    from zephon.text.tokenizer import load_tokenizer

    try:
        theirs, ours = load_tokenizer(model), load_tokenizer(recipe.tokenizer)
    except ConfigError as exc:
        return [f"--tokenizer-model {model!r}: {exc}"]
    problems = []
    if len(theirs) < len(ours):
        problems.append(
            f"--tokenizer-model {model!r} has {len(theirs)} ids, the recipe's tokenizer "
            f"{recipe.tokenizer!r} ({recipe.source}) {len(ours)}: Megatron sizes the model's "
            "vocabulary from --tokenizer-model, so the data's ids above it would not fit. Pass "
            "the recipe's tokenizer as --tokenizer-model, or point [tokenize] tokenizer at "
            "Megatron's")
    try:
        check_tokenizers(recipe, args, HuggingFaceTokenizer(getattr(theirs, "eos_token_id",
                                                                    None)))
    except ConfigError as exc:
        problems.append(str(exc))
    return problems


SCAN_CHUNK = 1 << 26
"""Token ids read at a time when a ``.bin`` is scanned for its largest id (256 MiB of int32)."""


def token_id_problems(args: argparse.Namespace, recipe: Any) -> list[str]:
    """Token ids of Megatron indexed data at or above ``--vocab-size`` (see the module
    docstring for the cost)."""
    vocab = getattr(args, "vocab_size", None)
    if not vocab or recipe.tokenizer is not None:
        return []
    from zephon.io.indexed import open_indexed

    problems = []
    for prefix in indexed_prefixes(recipe):
        data = open_indexed(prefix)
        if data.dtype.kind == "u" and 1 << (8 * data.dtype.itemsize) <= vocab:
            continue  # the dtype cannot hold an id >= vocab
        tokens = data.tokens
        largest = max((int(tokens[i:i + SCAN_CHUNK].max())
                       for i in range(0, len(tokens), SCAN_CHUNK)), default=-1)
        if largest >= vocab:
            problems.append(
                f"{prefix}: holds token id {largest}, but --vocab-size is {vocab} (ids "
                f"0..{vocab - 1}); the model's embedding has no row for it. Pass the vocabulary "
                "the data was written with (--vocab-size, or its --tokenizer-type/"
                "--tokenizer-model)")
    return problems


# -- batch sizes -------------------------------------------------------------------------------
def megatron_ramps() -> bool:
    """Whether the installed megatron-core applies ``--rampup-batch-size`` (its
    ``RampupBatchsizeNumMicroBatchesCalculator``; gone from 0.19), read from the module's
    source so that the check does not import megatron.core (slow to import; measured:
    docs/measurements.md)."""
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        return False
    for base in (spec.submodule_search_locations or []) if spec else []:
        path = Path(base) / "core" / "num_microbatches_calculator.py"
        if path.is_file():
            return "class RampupBatchsizeNumMicroBatchesCalculator" in path.read_text()
    return False


def batch_problems(args: argparse.Namespace, world_size: int | None = None,
                   ramp: tuple[int, int, int] | None = None) -> list[str]:
    """Batch sizes megatron-core's microbatch calculators would refuse with an AssertionError
    after the model is built (see the module docstring)."""
    final = getattr(args, "global_batch_size", None)
    mbs = getattr(args, "micro_batch_size", None)
    if not final or not mbs:
        return []  # Megatron defaults --global-batch-size to micro batch x data parallel
    dp = data_parallel_size(args, world_size)
    rows = mbs * dp
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    per = (f"--micro-batch-size {mbs} x data-parallel size {dp} = {rows} (world size {world}"
           + (f" / {model_ways(args)} model-parallel ranks" if model_ways(args) > 1 else "")
           + ")")
    if getattr(args, "decrease_batch_size_if_needed", False):
        sizes = [("--global-batch-size", final)]
        if ramp and megatron_ramps():
            sizes.insert(0, ("the --rampup-batch-size start", ramp[0]))
        return [f"{name} {size} is less than {per}: --decrease-batch-size-if-needed would round "
                f"it down to 0 microbatches. Raise it to at least {rows}"
                for name, size in sizes if size < rows]
    problems = []
    if ramp and megatron_ramps():
        start, increment, _ = ramp
        if start % rows or (final > start and increment % rows):
            bad = "start" if start % rows else "increment"
            problems.append(
                f"--rampup-batch-size {' '.join(map(str, ramp))}: every global batch size of "
                f"the ramp ({start}, {start + increment}, ... {final}) must be a multiple of "
                f"{per}, and its {bad} ({start if bad == 'start' else increment}) is not; "
                "Megatron would stop with an AssertionError when the ramp reaches it. Make the "
                f"start and the increment multiples of {rows}, or pass "
                "--decrease-batch-size-if-needed")
    if final % rows:
        below, above = final - final % rows, final - final % rows + rows
        problems.append(
            f"--global-batch-size {final} is not divisible by {per}: Megatron would stop with "
            "an AssertionError after building the model. Use a multiple of "
            f"{rows} ({', '.join(str(v) for v in (below, above) if v > 0)}), change "
            "--micro-batch-size or the number of ranks, or pass --decrease-batch-size-if-needed")
    return problems


# -- amount of training data --------------------------------------------------------------------
def _schedule(args: argparse.Namespace, dp: int) -> Any:
    """A :class:`~zephon_megatron.step_metrics.StepClock` of Megatron's running global batch size
    (megatron-core's ramp rule, without importing megatron.core)."""
    from zephon_megatron.step_metrics import StepClock

    mbs = args.micro_batch_size
    rows = mbs * dp
    final = getattr(args, "global_batch_size", None) or rows
    ramp = rampup(args) if megatron_ramps() else None
    decrease = getattr(args, "decrease_batch_size_if_needed", False)

    def running(consumed: int) -> int:
        size = final
        if ramp and consumed <= ramp[2] and final > ramp[0]:
            start, increment, samples = ramp
            per_increment = samples / ((final - start) // increment)
            size = start + (int(consumed / per_increment) if per_increment else 0) * increment
            size = min(size, final)
        return size - size % rows if decrease else size

    return StepClock(running, rows, ramp_samples=ramp[2] if ramp else 0)


def training_samples(args: argparse.Namespace, dp: int) -> tuple[int, str] | None:
    """(samples Megatron's training loop consumes, the flag that sets it), or None."""
    iters = getattr(args, "train_iters", None)
    samples = getattr(args, "train_samples", None)
    if not iters and not samples:
        return None
    clock = _schedule(args, dp)
    if samples:
        clock.seek(int(samples))
        return clock.consumed_samples, f"--train-samples {samples}"
    consumed = iteration = 0
    while iteration < iters and consumed <= clock.ramp_samples and clock.ramp_samples:
        consumed += clock._rows(consumed)
        iteration += 1
    consumed += (iters - iteration) * clock._rows(consumed)
    return consumed, f"--train-iters {iters}"


def data_shortfall(args: argparse.Namespace, recipe: Any, pipeline: Any,
                   dp: int) -> str | None:
    """Why the training data runs out before the run ends, or None
    (:mod:`zephon.integration.data_amount`: the rows the data yields against the samples
    Megatron's loop consumes, the batch-size ramp included)."""
    from zephon.integration import data_supply

    need = training_samples(args, dp)
    if need is None:
        return None
    needed, flag = need
    pack = recipe.pack
    row = int((pack.max_length if pack is not None else None) or args.seq_length + 1)
    supply = data_supply(recipe, pipeline, row, args.micro_batch_size, dp)
    if supply is None or not supply.short_of(needed):
        return None
    clock = _schedule(args, dp)
    clock.seek(supply.rows + 1)
    fits = max(0, clock.iteration - 1)
    lower = (f"lower {flag.split()[0]} (to {fits} iterations or fewer)" if fits else
             "lower --global-batch-size (the data does not fill one iteration of it)")
    return supply.shortfall(recipe.source, f"{flag} x the global batch size needs {needed:,} "
                            f"samples (near iteration {clock.iteration})", lower, row)


# -- resume ------------------------------------------------------------------------------------
def resume_iteration(args: argparse.Namespace) -> int | None:
    """The iteration a resume would read the loader state of (``--ckpt-step``, else the
    latest checkpoint of ``--load``), or None (no resume)."""

    _, state_dir = state_directories(args)
    load = getattr(args, "load", None)
    if not state_dir or not load or getattr(args, "finetune", False):
        return None  # --finetune: Megatron starts at iteration 0, the loader at its start
    return checkpoint_iteration(load, getattr(args, "ckpt_step", None)) or None


def resume_problems(args: argparse.Namespace, pipeline: Any, recipe: Any) -> list[str]:
    """The loader state a resume would read, checked against this run's pipeline (built from
    ``recipe`` by :func:`build_pipeline`) as the restore checks it (its fingerprint;
    ``--micro-batch-size``). Where the fingerprint needs the vocabulary of a tokenizer only
    Megatron sizes, the provider checks it instead (the same check, inside ``pretrain()``)."""
    iteration = resume_iteration(args)
    if iteration is None:
        return []
    from zephon.errors import StateMismatchError
    from zephon.integration import read_state
    from zephon.integration import resume_problems as resume_problems_of
    from zephon_megatron.vocabulary import model_vocabulary, needs_model_vocabulary

    if needs_model_vocabulary(recipe) and model_vocabulary(args) is None:
        return []  # the bound is Megatron's tokenizer's: the provider checks the resume

    _, state_dir = state_directories(args)
    try:
        states = read_dataloader_states(state_dir, iteration)
    except StateMismatchError:
        return []  # the provider says it (a resume without a loader state), with the counters
    restart = (f"To start over instead, write to a new --save directory (and drop --load); "
               f"to resume, keep the lanes, seed and recipe of the run that wrote {state_dir}")
    where = f"{state_dir} (iteration {iteration})"
    try:
        saved = read_state(states, f"the loader state in {where}")
    except StateMismatchError as exc:
        return [f"{exc} {restart}"]
    return resume_problems_of(pipeline, saved, where=where, restart=restart,
                              microbatch_size=args.micro_batch_size, flag="--micro-batch-size")
