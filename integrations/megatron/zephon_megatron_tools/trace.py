"""What was in iteration N of a Megatron run, from the run's own command line.

``python -m zephon_megatron_tools.trace --steps 11:12 --world-size W [--from-state DIR] [--json]
-- <the run's Megatron flags>`` lists every training microbatch of Megatron's iterations 11
and 12, the data-parallel rank that trained on it and each row's documents, as ``zephon
trace`` does for a recipe, but for any run of the adapter: a ``--zephon-recipe``, a
``--data-path``/``--data-args-path`` blend or per-split blends, read from the flags as the run
read them (the recipes of :func:`~zephon_megatron.arguments.settings_from_args`, the model's
vocabulary of :func:`~zephon_megatron.vocabulary.run_recipe`, the run's lanes).

Where it starts: ``--from-state`` (an ``iter_<7 digits>`` folder, or a checkpoint directory
whose ``latest_checkpointed_iteration.txt`` names one), else the run's own ``--load`` at
``--ckpt-step`` (else its latest iteration), else the start of the data. The loader state is
read from Megatron's ``train_dataloader_dprank*.pt`` files, which sit beside the model
checkpoint in every format (``torch_dist`` included), with ``torch.load(weights_only=True)``.

Iterations to microbatches. Reader ``r`` of ``W`` hands out global microbatches ``r, r + W,
r + 2W, ...`` (lane ``g % L``, and ``L`` is a multiple of ``W``), so every iteration is a
contiguous range of global microbatches: as many as Megatron's running global batch size over
``--micro-batch-size``. With ``--rampup-batch-size`` (megatron-core <= 0.18 applies it) the
running size follows megatron-core's ramp (:func:`~zephon_megatron.provider.step_clock`), one
iteration at a time through the ramp and by division after it. Microbatch ``g`` went to
data-parallel rank ``g % W``.

Limits: the datasets must be readable from here; a tokenizer that only Megatron sizes (vocab
and merge files, SentencePiece) needs ``--padded-vocab-size`` among the flags so that the
state's fingerprint can be matched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, StateMismatchError
from zephon.trace import row_lines
from zephon_megatron.flags import split_command_line


def iteration_ranges(clock: Any, micro_batch_size: int, first: int, last: int
                     ) -> list[tuple[int, int, int]]:
    """(iteration, first global microbatch, microbatches) of Megatron's iterations ``first``
    to ``last`` (from 1) under ``clock``'s running global batch size."""
    ranges = []
    consumed = start = 0
    iteration = 1
    while iteration <= last:
        rows = clock._rows(consumed)
        if consumed > clock.ramp_samples and iteration < first:  # constant from here on
            skip = first - iteration
            consumed += skip * rows
            start += skip * (rows // micro_batch_size)
            iteration = first
            continue
        if iteration >= first:
            ranges.append((iteration, start, rows // micro_batch_size))
        consumed += rows
        start += rows // micro_batch_size
        iteration += 1
    return ranges


def iteration_of_state(clock: Any, consumed_samples: int) -> int:
    """The iterations done when ``consumed_samples`` were consumed."""
    clock.seek(consumed_samples)
    return clock.iteration


def state_location(from_state: str | None, args: argparse.Namespace
                   ) -> tuple[str, int] | None:
    """(directory holding ``iter_*`` folders, iteration) of the loader state to start from."""
    from zephon_megatron.state_files import checkpoint_iteration, state_directories

    if from_state:
        path = Path(from_state)
        if not path.exists():
            raise ConfigError(f"--from-state {from_state!r} does not exist")
        if path.name.startswith("iter_") and path.name[5:].isdigit():
            return str(path.parent), int(path.name[5:])
        iteration = checkpoint_iteration(path, getattr(args, "ckpt_step", None))
        if not iteration:
            raise ConfigError(f"--from-state {from_state!r}: name an iter_<7 digits> folder "
                              "(no latest_checkpointed_iteration.txt here)")
        return str(path), iteration
    _, load = state_directories(args)
    if not load or not getattr(args, "load", None) or getattr(args, "finetune", False):
        return None
    iteration = checkpoint_iteration(load, getattr(args, "ckpt_step", None))
    return (load, iteration) if iteration else None


def _decoder(recipe: Any, args: argparse.Namespace) -> Any:
    from zephon.text.tokenizer import load_tokenizer

    name = recipe.tokenizer
    model = getattr(args, "tokenizer_model", None)
    if name is None and getattr(args, "tokenizer_type", None) == "HuggingFaceTokenizer" \
            and model and os.path.isdir(os.path.expanduser(model)):
        name = model
    if name is None:
        return None
    loaded = load_tokenizer(name)
    return lambda ids: loaded.decode(ids, skip_special_tokens=True)


def trace_run(flags: Sequence[str], first: int, last: int, world_size: int,
              from_state: str | None = None) -> Iterator[Any]:
    """The traced microbatches (:class:`zephon.trace.TracedMicrobatch`, ``step`` being
    Megatron's iteration) of iterations ``first`` to ``last`` of the run of ``flags``."""
    from zephon.integration import read_state
    from zephon.trace import trace_steps
    from zephon_megatron.arguments import (
        build_standalone_parser,
        settings_from_args,
        training_recipes,
    )
    from zephon_megatron.geometry import data_parallel_size
    from zephon_megatron.provider import step_clock
    from zephon_megatron.state_files import read_dataloader_states
    from zephon_megatron.vocabulary import run_recipe

    args, _ = build_standalone_parser().parse_known_args(list(flags))
    location = state_location(from_state, args)
    if location is not None:  # the run's lanes are the state's
        saved = read_state(read_dataloader_states(*location), str(location[0]))
        if getattr(args, "zephon_lanes", None) is None:
            args.zephon_lanes = saved.lane_count
    settings = settings_from_args(args, world_size=world_size)
    dp = data_parallel_size(args, world_size)
    recipe = run_recipe(training_recipes(settings)["train"], args)
    pipeline = recipe.build(seq_len=settings.seq_length,
                            microbatch_size=settings.micro_batch_size, lanes=settings.lanes,
                            dp_rank=0, dp_world_size=1, prefetch=0, workers=0)
    state = None
    clock = step_clock(settings, dp)
    if location is not None:
        state = saved.entries
        consumed = int(next(iter(state.values()))["consumed_global"]) * \
            settings.micro_batch_size
        done = iteration_of_state(step_clock(settings, dp), consumed)
        if done >= first:
            raise ConfigError(f"the loader state ({location[0]}, iteration {location[1]}) is "
                              f"after iteration {first - 1}: trace iterations after {done}, or "
                              "give an earlier --from-state")
    ranges = iteration_ranges(clock, settings.micro_batch_size, first, last)
    if not ranges:
        return
    iteration_of = {g: it for it, start, count in ranges for g in range(start, start + count)}
    begin, end = ranges[0][1], ranges[-1][1] + ranges[-1][2] - 1
    for traced in trace_steps(pipeline, begin + 1, end + 1, 1, dp, state,
                              _decoder(recipe, args)):
        yield dataclasses.replace(traced, step=iteration_of[traced.global_microbatch])


def _from_run(folder: str, flags: Sequence[str], first: int, from_state: str | None
              ) -> tuple[list[str], int, str | None]:
    """(flags, world size, state to start from) of the run whose ``--save`` is
    ``folder``, from its run record (:class:`zephon.integration.RunRecord`)."""
    from zephon.integration import RunRecord
    from zephon_megatron.arguments import build_standalone_parser
    from zephon_megatron.geometry import model_ways

    if flags:
        raise ConfigError("--run reads the run's flags from its record: give no flags after --")
    run = RunRecord.read(folder)
    if run.framework != "megatron":
        raise ConfigError(f"{folder} is a {run.framework} run: trace it with zephon trace "
                          f"{folder} --steps ...")
    args, _ = build_standalone_parser().parse_known_args(list(run.flags))
    flags = list(run.flags)
    if from_state is None:
        done = [int(p.name[5:]) for p in Path(folder).glob("iter_*")
                if p.name[5:].isdigit() and int(p.name[5:]) < first]
        from_state = str(Path(folder) / f"iter_{max(done):07d}") if done else None
        if from_state is None and "--load" in flags:  # from the start: not the run's --load
            at = flags.index("--load")
            del flags[at:at + 2]
    return flags, run.dp_size * model_ways(args), from_state


def _steps(text: str) -> tuple[int, int]:
    first, _, last = text.partition(":")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not N or N:M: {text!r}") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"iterations count from 1 and N <= M: {text!r}")
    return a, b


def main(argv: Sequence[str] | None = None) -> int:
    own, flags = split_command_line(argv)
    parser = argparse.ArgumentParser(prog="python -m zephon_megatron_tools.trace",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", required=True, type=_steps,
                        help="a Megatron iteration (12) or an inclusive range (11:12)")
    parser.add_argument("--run", default=None, metavar="SAVE_DIR",
                        help="the run's --save directory: its zephon-run.json gives the flags "
                        "and sizes, and its newest iter_ folder before the first iteration "
                        "the start (no flags after --)")
    parser.add_argument("--world-size", type=int, default=int(os.environ.get(
        "WORLD_SIZE", "1")), help="processes of the run (data-parallel size x tensor x "
        "pipeline x context parallel sizes)")
    parser.add_argument("--from-state", default=None,
                        help="an iter_<7 digits> folder or a checkpoint directory (default: "
                        "the run's --load at --ckpt-step)")
    parser.add_argument("--json", action="store_true", help="one JSON object per microbatch")
    options = parser.parse_args(own)
    first, last = options.steps
    try:
        if options.run is not None:
            flags, options.world_size, options.from_state = _from_run(
                options.run, flags, first, options.from_state)
        for traced in trace_run(flags, first, last, options.world_size, options.from_state):
            if options.json:
                print(json.dumps(dataclasses.asdict(traced)), flush=True)
                continue
            print(f"iteration {traced.step} microbatch {traced.global_microbatch} (lane "
                  f"{traced.lane}, dp rank {traced.dp_rank})")
            print("\n".join(row_lines(traced)), flush=True)
    except (ConfigError, StateMismatchError) as exc:
        print(f"zephon_megatron_tools.trace: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
