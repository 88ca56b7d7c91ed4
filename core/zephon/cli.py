"""The ``zephon`` command: work on a data recipe, or on the shard cache, from the shell.

- ``zephon schema [SECTION]``: every recipe key with its type, default and meaning.
- ``zephon check RECIPE [--world-size W --seq-len S --vocab-size V --microbatch-size M]``:
  the preflight (:mod:`zephon.recipe.checks`): every problem, exit 1 when there is one.
- ``zephon preview RECIPE [--rows N] [--out batch.png|batch.html] [--seq-len S]``: the first
  microbatch as a picture (:mod:`zephon.preview`), in the terminal without ``--out``.
- ``zephon stats RECIPE [--tokens 1T]``: files, documents and tokens per dataset, targets,
  and the epochs each dataset needs for a token budget: what runs out first.
- ``zephon trace RUN_DIR --steps N[:M] [--json]``: each microbatch of those steps, row by
  row: every document's dataset, file, row, tokens and a text excerpt (:mod:`zephon.trace`).
  The run's folder says the recipe and the sizes (the record the adapters write,
  :mod:`zephon.integration.run_record`), and the trace starts from its newest checkpoint
  before step N without replaying earlier steps. ``zephon trace RECIPE --steps N[:M]
  --world-size W --global-batch-size G [--microbatch-size B] [--seq-len S] [--from-state
  CHECKPOINT]`` does the same for a recipe and sizes given by hand.
- ``zephon plan RECIPE --out FILE [--lanes L]``: the datasets listed and their units cut once
  for ``L`` lanes, written to ``FILE`` (:mod:`zephon.work.plan_file`); a recipe naming it
  (``plan = "FILE"``) starts every rank of every job from it without listing a file.
- ``zephon cache ls|prune|verify [--root DIR]``: the shard cache's shards (what, size, last
  use, in use), pruning to a size (``--to 50G``; shards in use stay), re-hashing every shard.
  The root defaults to ``$ZEPHON_CACHE_ROOT``, else the per-user default of ``CacheOptions``;
  ``ls`` and ``verify`` write nothing (``verify`` removes a bad shard when it can), so they
  work on a read-only cache.

Exit status: 0 when all is well, 1 when the command found problems, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9, "T": 10**12}


def size(text: str) -> int:
    """``1T``, ``500B`` (billions), ``20M``, ``10G`` or a plain count."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGBT]?)\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 1T, 500B or 20M")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _steps(text: str) -> tuple[int, int]:
    first, _, last = text.partition(":")
    try:
        steps = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step (12) or a range (11:12)"
                                         ) from None
    if steps[0] < 1 or steps[1] < steps[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: steps count from 1, first <= last")
    return steps


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


PRESET_NAMES = ("torchtitan", "megatron", "torch")


def _recipe_command(commands: Any, name: str, what: str, description: str | None = None,
                    recipe: str = "data recipe TOML") -> argparse.ArgumentParser:
    """A subcommand that reads a recipe: its ``recipe`` argument and ``--preset``."""
    parser = commands.add_parser(name, help=what, description=description)
    parser.add_argument("recipe", help=recipe)
    _preset_argument(parser)
    return parser


def _preset_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=PRESET_NAMES, default=None,
                        help="read the recipe as that framework's adapter does: the "
                             "[to_training] values it fixes count as given, and its choices "
                             "fill the keys the recipe leaves out")


def _read_recipe(args: argparse.Namespace) -> Any:
    """The recipe named on the command line, read with ``--preset``'s adapter choices."""
    from zephon.recipe import DataRecipe

    return DataRecipe.from_toml(args.recipe, preset=_preset(args))


def _preset(args: argparse.Namespace) -> Any:
    if getattr(args, "preset", None) is None:
        return None
    from zephon.recipe.presets import PRESETS

    return PRESETS[args.preset]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zephon", description="Zephon data loader tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = _recipe_command(
        commands, "check", "find every problem of a data recipe before training",
        "Check a data recipe and its data (files, fields, tokenizer, lanes, lengths, Hub "
        "paths) without tokenizing; prints every problem found.")
    check.add_argument("--world-size", type=_positive, help="data-parallel size of the run")
    check.add_argument("--seq-len", type=_positive, help="the model's context length")
    check.add_argument("--vocab-size", type=_positive, help="the model's vocabulary size")
    check.add_argument("--microbatch-size", type=_positive, help="rows per microbatch")
    preview = _recipe_command(commands, "preview", "the first microbatch as a picture")
    preview.add_argument("--rows", type=_positive, default=4, help="rows to show")
    preview.add_argument("--seq-len", type=_positive, default=None,
                         help="context length (default: the recipe's [pack] max_length - 1, "
                              "else 128)")
    preview.add_argument("--out", help="write a .png or .html instead of printing")
    preview.add_argument("--shares", action="store_true",
                         help="mixture shares over the run instead of the first microbatch: "
                              "target and delivered, window by window (with --tokens)")
    preview.add_argument("--tokens", type=size, default=None,
                         help="--shares: tokens of the run to show (2M, 1B)")
    preview.add_argument("--windows", type=_positive, default=20,
                         help="--shares: windows the tokens are cut into")
    preview.add_argument("--targets-only", action="store_true",
                         help="--shares: the schedule's targets alone, without running the "
                              "pipeline")
    stats = _recipe_command(commands, "stats", "dataset sizes, targets and epochs")
    stats.add_argument("--tokens", type=size, default=None,
                       help="token budget of the run (1T, 500B, 20M) for the epochs column")
    trace = _recipe_command(
        commands, "trace", "the documents of every microbatch of given training steps",
        "What the trainer received at steps N to M: each microbatch's rows and their "
        "documents (dataset, file, row, tokens, a text excerpt).",
        "the run's folder (the zephon-run.json the adapters write there gives the recipe and "
        "the sizes, and its checkpoints the start), or the run's data recipe TOML")
    trace.add_argument("--steps", required=True, type=_steps,
                       help="a step (12) or an inclusive range (11:12), counted from 1")
    for flag, what in (
            ("--world-size", "data-parallel size of the run, which says which rank got each "
                             "(default: the state's, else 1)"),
            ("--global-batch-size", "rows per optimizer step over all ranks (default: what the "
                                    "state's microbatches over its checkpoint's step give)"),
            ("--microbatch-size", "rows per microbatch (default: the recipe's [batch], else the "
                                  "state's)"),
            ("--seq-len", "the run's context length (default: [pack] max_length - 1, else the "
                          "state's)"),
            ("--lanes", "the run's lanes (default: the recipe's, or the state's)")):
        trace.add_argument(flag, type=_positive, default=None, help=what)
    trace.add_argument("--from-state", default=None,
                       help="a checkpoint (TorchTitan step folder, Megatron-LM checkpoint "
                            "directory or iter_ folder, or a saved state_dict) to start from")
    trace.add_argument("--json", action="store_true", help="one JSON object per microbatch")
    schema = commands.add_parser(
        "schema", help="every recipe key: type, default and meaning",
        description="The keys a data recipe may hold, section by section, derived from the "
                    "classes that own them.")
    schema.add_argument("section", nargs="?", default=None,
                        help="one section (tokenize, pack, to_training, ...; 'top' for the "
                             "top level)")
    _preset_argument(schema)
    plan = commands.add_parser(
        "plan", help="list and plan a recipe's data once, for any number of jobs",
        description="List every dataset of a recipe and cut its work units for a lane count, "
                    "and write them to a file that recipes name with plan = \"FILE\": the "
                    "ranks of every job that uses it then list and open no file to start.")
    plan.add_argument("recipe", help="data recipe TOML")
    plan.add_argument("--out", required=True, help="the plan file to write")
    plan.add_argument("--lanes", type=_positive, default=None,
                      help="lanes of the runs (default: the recipe's)")
    cache = commands.add_parser("cache", help="inspect or prune the shard cache")
    cache.add_argument("action", choices=["ls", "prune", "verify"])
    cache.add_argument("--root", default=os.environ.get("ZEPHON_CACHE_ROOT"),
                       help="cache root (default: $ZEPHON_CACHE_ROOT, else "
                            "~/.cache/zephon/shard-cache or $XDG_CACHE_HOME/zephon/shard-cache)")
    cache.add_argument("--to", type=size, default=None, help="prune: bytes to keep (50G)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from zephon.errors import ZephonError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args, parser)
    except ZephonError as exc:
        print(f"zephon {args.command}: {exc}", file=sys.stderr)
        return 1


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zephon.recipe import DataRecipe, RecipeProblems
    from zephon.recipe.checks import check_recipe, describe

    try:
        recipe: Any = DataRecipe.from_toml(args.recipe, preset=_preset(args))
    except RecipeProblems as exc:
        problems = exc.problems
    else:
        problems = check_recipe(recipe, world_size=args.world_size, seq_len=args.seq_len,
                                vocab_size=args.vocab_size,
                                microbatch_size=args.microbatch_size)
    if problems:
        print(f"{args.recipe}: {len(problems)} problem(s)", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"{args.recipe}: ok ({describe(recipe)})")
    return 0


def _preview(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.shares:
        return _preview_shares(args, parser)
    from zephon.preview import first_batch, render_html, render_png, render_terminal

    rows = first_batch(args.recipe, rows=args.rows, seq_len=args.seq_len,
                       preset=_preset(args))
    title = f"{os.path.basename(args.recipe)}: first microbatch"
    if args.out is None:
        print(render_terminal(rows))
    elif args.out.endswith(".png"):
        render_png(rows, args.out, title)
        print(f"wrote {args.out}")
    elif args.out.endswith((".html", ".htm")):
        render_html(rows, args.out, title)
        print(f"wrote {args.out}")
    else:
        parser.error("--out must end in .png or .html")
    return 0


def _preview_shares(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zephon.preview_shares import (
        render_shares_html,
        render_shares_png,
        render_shares_terminal,
        share_windows,
    )

    if args.tokens is None:
        parser.error("--shares needs --tokens: how much of the run to show")
    if args.out is not None and not args.out.endswith((".png", ".html", ".htm")):
        parser.error("--out must end in .png or .html")
    windows = share_windows(args.recipe, args.tokens, args.windows,
                            measure=not args.targets_only, seq_len=args.seq_len)
    title = f"{os.path.basename(args.recipe)}: mixture shares over {args.tokens:,} tokens"
    if args.out is None:
        print(title)
        print(render_shares_terminal(windows))
    elif args.out.endswith(".png"):
        render_shares_png(windows, args.out, title)
        print(f"wrote {args.out}")
    else:
        render_shares_html(windows, args.out, title)
        print(f"wrote {args.out}")
    return 0


def _stats(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:

    recipe = _read_recipe(args)
    max_length = recipe.pack.max_length if recipe.pack is not None else None
    pipeline = recipe.build(seq_len=max_length - 1 if max_length else 2048,
                            microbatch_size=recipe.batch.microbatch_size or 1,
                            lanes=None if recipe.lanes else 1, prefetch=0)
    estimates = pipeline.estimate()
    source = pipeline.work_source
    schedule = source.schedule
    # A schedule's share of a budget is its integral over the budget; without a budget, the
    # first stage's shares (the stages are listed below the table).
    shares = ([t / args.tokens for t in schedule.targets(args.tokens)] if args.tokens
              else list(schedule.shares_at(0)))
    weights = dict(zip(schedule.names, shares, strict=True))
    repeated = dict(zip(source.names(), source.repeated, strict=True))
    print(f"{args.recipe}: mixing by {recipe.mix_by}"
          + (f", budget {args.tokens:,} tokens" if args.tokens else ""))
    print(f"{'dataset':<20}{'files':>6}{'documents':>15}{'tokens':>19}{'target':>8}"
          + (f"{'epochs':>9}" if args.tokens else ""))
    most = None
    for estimate in estimates:
        files = len(next(d for d in source.datasets if d.name == estimate.name).files())
        share = float(weights[estimate.name])
        line = (f"{estimate.name:<20}{files:>6}"
                f"{_count(estimate.documents, estimate.documents_exact):>15}"
                f"{_count(estimate.tokens, estimate.tokens_exact):>19}{share:>8.3f}")
        if args.tokens and estimate.tokens:
            epochs = args.tokens * share / estimate.tokens
            line += f"{epochs:>9.2f}"
            if most is None or epochs > most[1]:
                most = (estimate.name, epochs)
        print(line)
    print("~: estimated (tokens from a tokenized sample; JSON Lines documents from the bytes "
          "read); figures without ~ are counted")
    if not schedule.static:
        print("target: " + ("each dataset's share of the budget over all stages" if args.tokens
                            else "the first stage's shares"))
        for line in stage_lines(schedule):
            print(line)
    if most is not None:
        name, epochs = most
        if epochs <= 1:
            print(f"no dataset runs out: the most used, {name!r}, is read {epochs:.2f} times")
        elif repeated[name]:
            print(f"{name!r} runs out first and repeats: {epochs:.2f} epochs")
        else:
            print(f"{name!r} runs out first, after {100 / epochs:.0f}% of the budget; repeat it "
                  "([mixture] repeat) or lower the budget")
    return 0


def stage_lines(schedule: Any) -> list[str]:
    """A mixture schedule's stages, one line each: where each begins and ends in tokens
    handed to the trainer by the whole job, its ramp, its shares."""
    lines = ["mixture stages (tokens handed to the trainer by the whole job):"]
    for number, stage in enumerate(schedule.describe(), start=1):
        begins = int(schedule.stage_boundary(number - 1))
        until = stage["until_tokens"]
        span = f"{begins:,}..{until:,}" if until is not None else f"{begins:,}..end"
        ramp = f", ramp {stage['ramp_tokens']:,}" if stage["ramp_tokens"] else ""
        weights = "  ".join(f"{n} {w:.3f}" for n, w in stage["weights"].items() if w)
        lines.append(f"  stage {number}  {span}{ramp}:  {weights}")
    return lines


def _count(value: float | None, exact: bool) -> str:
    """A count as ``zephon stats`` prints it: ``~`` before an estimate, rounded to 3
    significant digits; ``?`` when unknown."""
    if value is None:
        return "?"
    if exact:
        return f"{int(value):,}"
    digits = max(0, len(str(int(value))) - 3)
    return f"~{int(round(value, -digits)):,}"


def _trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zephon.trace import geometry_of, read_loader_state, trace_steps

    seed = _from_run(args, parser) if Path(args.recipe).is_dir() else None
    recipe = _read_recipe(args)
    if seed is not None:
        recipe = dataclasses.replace(recipe, seed=seed)
    state = read_loader_state(args.from_state) if args.from_state else None
    run = geometry_of(state, args.from_state) if state is not None else None
    microbatch = args.microbatch_size or recipe.batch.microbatch_size or (
        run.microbatch_size if run else None)
    if not microbatch:
        parser.error("--microbatch-size is needed: the recipe's [batch] sets none")
    global_batch = args.global_batch_size or (
        run.microbatches_per_step * microbatch if run and run.microbatches_per_step else None)
    if global_batch is None:
        parser.error("--global-batch-size is needed: " + (
            "the state's checkpoint path names no step (step-N or iter_N) to count it from"
            if run else "without --from-state nothing tells it"))
    if global_batch % microbatch:
        parser.error(f"--global-batch-size {global_batch} is not a multiple of the "
                     f"microbatch size {microbatch}")
    max_length = recipe.pack.max_length if recipe.pack is not None else None
    seq_len = args.seq_len or (max_length - 1 if max_length else None) or (
        run.seq_len if run else None)
    if seq_len is None:
        parser.error("--seq-len is needed: the recipe's [pack] sets no max_length")
    args.world_size = args.world_size or (run.dp_world_size if run else None) or 1
    lanes = len(state) if state is not None else (args.lanes or recipe.lanes)
    if not lanes:
        parser.error("--lanes is needed: the recipe sets none (the run's log names them)")
    pipeline = recipe.build(seq_len=seq_len, microbatch_size=microbatch, dp_rank=0,
                            dp_world_size=1, lanes=lanes, prefetch=0)
    decode = _text_decoder(recipe.tokenizer)
    first, last = args.steps
    # A step the state cannot account for, or past the end of the data, raises after the
    # steps it could trace are printed: main() says why and exits 1.
    _print_traces(trace_steps(pipeline, first, last, global_batch // microbatch,
                              args.world_size, state, decode), args)
    return 0


def _from_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int | None:
    """``zephon trace RUN_DIR``: the recipe, preset and sizes from the run's record
    (:mod:`zephon.integration.run_record`), and (without ``--from-state``) the newest of its
    checkpoints before the first step asked for. Returns the seed the run chose, if any."""
    from zephon.integration.run_record import RUN_RECORD, RunRecord, find_record

    folder = Path(args.recipe)
    if find_record(folder) is None:
        parser.error(f"{folder} is a folder without {RUN_RECORD}: name the run's folder (the "
                     "adapters write the record into it when training starts) or its data "
                     "recipe TOML")
    run = RunRecord.read(folder)
    if run.framework == "megatron" or run.recipe is None:
        # Megatron's flags shape the data beyond the recipe (its seed, the model's
        # vocabulary, blends, the batch-size ramp): the adapter's tool reads them
        parser.error(f"{folder} is a {run.framework} run: trace it with python -m "
                     f"zephon_megatron_tools.trace --run {folder} --steps ...")
    args.recipe, args.preset = run.recipe, args.preset or run.framework
    args.world_size = args.world_size or run.dp_size
    args.microbatch_size = args.microbatch_size or run.microbatch_size
    args.global_batch_size = args.global_batch_size or (
        run.microbatches_per_step * args.microbatch_size)
    args.seq_len, args.lanes = args.seq_len or run.seq_len, args.lanes or run.lanes
    if args.from_state is None and run.checkpoints:
        steps = [(int(m.group(1)), path) for path in (folder / run.checkpoints).glob("*")
                 if (m := re.fullmatch(r"(?:step-|iter_)(\d+)", path.name))
                 and int(m.group(1)) < args.steps[0]]
        args.from_state = str(max(steps)[1]) if steps else None
    return run.seed


def _print_traces(traces: Iterator[Any], args: argparse.Namespace) -> None:
    import json

    from zephon.trace import row_lines

    for traced in traces:
        if args.json:
            print(json.dumps(dataclasses.asdict(traced)))
            continue
        stage = f", mixture stage {traced.stage}" if traced.stage is not None else ""
        print(f"step {traced.step} microbatch {traced.global_microbatch} (lane {traced.lane}, "
              f"dp rank {traced.dp_rank} of {args.world_size}{stage})")
        print("\n".join(row_lines(traced)), flush=True)


def _text_decoder(tokenizer: str | None):
    if tokenizer is None:
        return None
    from zephon.text.tokenizer import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    return lambda ids: loaded.decode(ids, skip_special_tokens=True)


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zephon.recipe import DataRecipe, FrameworkValues
    from zephon.work.plan_file import write_plan

    started = time.perf_counter()
    recipe = DataRecipe.from_toml(args.recipe)
    if recipe.plan is not None:
        parser.error(f"{args.recipe} names a plan already (plan = {recipe.plan!r}); remove it "
                     "to plan the files again")
    lanes = args.lanes or recipe.lanes
    if lanes is None:
        parser.error("--lanes is needed: the recipe sets no lanes")
    if recipe.lanes is not None and args.lanes is not None and recipe.lanes != args.lanes:
        parser.error(f"--lanes {args.lanes} conflicts with the recipe's lanes = {recipe.lanes}")
    source = recipe.resolve(FrameworkValues(lanes=lanes)).work_source()
    header = write_plan(source, lanes, args.out)
    files = sum(len(d["files"]) for d in header["datasets"])
    units = sum(d["unit_count"] for d in header["datasets"])
    print(f"wrote {args.out}: {len(header['datasets'])} dataset(s), {files:,} files, "
          f"{units:,} units for {lanes} lanes, {os.path.getsize(args.out):,} bytes, in "
          f"{time.perf_counter() - started:.1f} s; name it in the recipe: "
          f"plan = \"{args.out}\"")
    return 0


def _cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Names come from cache records (and so from remote listings): printed escaped, one
    line each. ``verify`` exits 1 when any shard is bad."""
    from zephon.io.cache.shard_cache import cache_entries, prune_cache, verify_cache
    from zephon.io.printable import printable
    from zephon.io.store_options import default_cache_root

    if not args.root:
        args.root = str(default_cache_root())
    if args.action == "ls":
        entries = cache_entries(args.root)
        for entry in entries:
            when = datetime.datetime.fromtimestamp(entry.last_use).strftime("%Y-%m-%d %H:%M")
            print(f"{entry.size:>14,}  {when}  {'in use' if entry.in_use else '      '}  "
                  f"{printable(entry.display)}")
        print(f"{len(entries)} shard(s), {sum(e.size for e in entries):,} bytes")
        return 0
    if args.action == "prune":
        if args.to is None:
            parser.error("prune needs --to SIZE (bytes to keep, e.g. 50G)")
        evicted, left = prune_cache(args.root, args.to)
        print(f"removed {len(evicted)} shard(s); {left:,} bytes left")
        return 0 if left <= args.to else 1
    results = verify_cache(args.root)
    bad = [(e, p) for e, p in results if p]
    for entry, problem in bad:
        print(f"{printable(entry.display)}: {printable(problem)}", file=sys.stderr)
    by_size = sum(1 for entry, problem in results if not problem and not entry.content_checked)
    note = (f" ({by_size} checked by size only: their version is no content hash)"
            if by_size else "")
    print(f"verified {len(results)} shard(s), {len(bad)} bad{note}")
    return 1 if bad else 0


def _schema(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from zephon.recipe import recipe_schema
    from zephon.recipe.schema import format_schema

    schema = recipe_schema()
    if args.preset is not None:
        from zephon.recipe.presets import preset_schema

        schema = preset_schema(schema, _preset(args))
    if args.section is not None:
        wanted = "" if args.section in ("top", "") else args.section.strip("[]")
        chosen = {k: v for k, v in schema.items() if k == wanted or k.startswith(wanted + ".")}
        if not chosen:
            parser.error(f"no section {args.section!r}; sections: top, "
                         + ", ".join(k for k in schema if k))
        schema = chosen
    print(format_schema(schema), end="")
    return 0


_COMMANDS = {"check": _check, "preview": _preview, "stats": _stats, "trace": _trace,
             "schema": _schema, "plan": _plan, "cache": _cache}


if __name__ == "__main__":
    sys.exit(main())
