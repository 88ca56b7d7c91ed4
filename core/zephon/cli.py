"""The ``zephon`` command: work on a data recipe from the shell.

``zephon check RECIPE [--world-size W] [--seq-len S] [--vocab-size V] [--microbatch-size M]``
runs the preflight (:mod:`zephon.preflight`) and prints every problem, exiting 1 when there
is one (2 for a usage error), 0 when the recipe is ready.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zephon", description="Zephon data loader tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check", help="find every problem of a data recipe before training",
        description="Check a data recipe and its data (files, fields, tokenizer, lanes, "
                    "lengths, Hub paths) without tokenizing; prints every problem found.")
    check.add_argument("recipe", help="data recipe TOML")
    check.add_argument("--world-size", type=_positive, help="data-parallel size of the run")
    check.add_argument("--seq-len", type=_positive, help="the model's context length")
    check.add_argument("--vocab-size", type=_positive, help="the model's vocabulary size")
    check.add_argument("--microbatch-size", type=_positive, help="rows per microbatch")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        from zephon.preflight import check_recipe, describe

        problems = check_recipe(args.recipe, world_size=args.world_size, seq_len=args.seq_len,
                                vocab_size=args.vocab_size,
                                microbatch_size=args.microbatch_size)
        if problems:
            print(f"{args.recipe}: {len(problems)} problem(s)", file=sys.stderr)
            for problem in problems:
                print(f"  - {problem}", file=sys.stderr)
            return 1
        print(f"{args.recipe}: ok ({describe(args.recipe)})")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
