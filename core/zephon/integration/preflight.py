"""What every adapter's preflight shares: the resume checked before the model is built, and
one list of problems for the whole job.

A framework builds its dataloader last (after the model, the parallelization and the
checkpoint load), so an adapter checks the data first: the recipes against the run
(:func:`zephon.recipe.checks.check_recipe`), then the loader state a resume would read
(:func:`resume_problems`), then what its framework adds. Every rank runs the same checks and
finds the same problems; :func:`refusal` words them so that global rank 0 lists them and the
other ranks only say so (one list in the log, not one per rank).
"""

from __future__ import annotations

from typing import Any

from zephon.errors import StateMismatchError
from zephon.integration.geometry import global_rank
from zephon.integration.state_envelope import LoaderState


def refusal(problems: list[str], what: str = "zephon preflight",
            when: str = "before the model is built") -> str:
    """The error message of a preflight that found ``problems``: all of them on global rank
    0, a pointer to rank 0's list elsewhere."""
    if global_rank() != 0:
        return f"{what} found {len(problems)} problem(s) {when}; global rank 0 lists them"
    return f"{what} found problems {when}:\n" + "\n".join(f"  - {p}" for p in problems)


def resume_problems(pipeline: Any, saved: LoaderState, *, where: str, restart: str,
                    microbatch_size: int | None = None, flag: str = "the microbatch size"
                    ) -> list[str]:
    """The loader state a resume would read (``saved``, from the checkpoint ``where``)
    against the pipeline this run builds (not iterated), as the restore checks it: its
    fingerprint (lanes, seed, datasets, mixture, operators) in the restore's own words, and
    (``microbatch_size`` given) the rows per microbatch the adapter's envelope recorded
    (``flag`` names the option). ``restart`` ends every message: how to start the data over
    instead."""
    problems = []
    written = next((f.get("micro_batch_size") for f in saved.framework
                    if f.get("micro_batch_size") is not None), None)
    if microbatch_size is not None and written is not None and written != microbatch_size:
        problems.append(f"the loader state in {where} was written with {flag} {written}, this "
                        f"run has {microbatch_size}; the microbatches of every lane would "
                        f"differ. {restart}")
    if saved.entries:
        try:
            pipeline.check_state(saved.entries)
        except StateMismatchError as exc:
            problems.append(f"cannot resume the Zephon dataloader from {where}: {exc} "
                            f"{restart}")
    return problems
