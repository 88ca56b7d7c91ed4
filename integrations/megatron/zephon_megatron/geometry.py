"""The run's shape as Megatron's flags give it: data-parallel size and batch-size ramp."""

from __future__ import annotations

import argparse
import os

from zephon_megatron.adapter_error import ZephonArgumentError


def data_parallel_size(args: argparse.Namespace, world_size: int | None = None) -> int:
    """``world_size`` (default ``WORLD_SIZE``) over tensor x pipeline x context parallel."""
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    return max(1, world // model_ways(args))


def model_ways(args: argparse.Namespace) -> int:
    return (max(1, getattr(args, "tensor_model_parallel_size", 1) or 1)
            * max(1, getattr(args, "pipeline_model_parallel_size", 1) or 1)
            * max(1, getattr(args, "context_parallel_size", 1) or 1))


def rampup(args: argparse.Namespace) -> tuple[int, int, int] | None:
    """``--rampup-batch-size START INCREMENT SAMPLES`` as Megatron reads it (three integers,
    START <= --global-batch-size, the difference a multiple of INCREMENT), or None."""
    values = getattr(args, "rampup_batch_size", None)
    if not values:
        return None
    try:
        start, increment, samples = (int(v) for v in values)
    except ValueError:
        raise ZephonArgumentError(
            f"--rampup-batch-size takes three integers (start batch size, increment, ramp-up "
            f"samples), e.g. '--rampup-batch-size 32 32 1000000'; got {values}") from None
    final = getattr(args, "global_batch_size", None)
    if start < 1 or increment < 1 or samples < 0 or final is None or start > final or \
            (final - start) % increment:
        raise ZephonArgumentError(
            f"--rampup-batch-size {start} {increment} {samples} does not reach "
            f"--global-batch-size {final}: give start >= 1, increment >= 1, samples >= 0 and a "
            "global batch size that is start plus a multiple of the increment")
    return start, increment, samples
