"""Loader metrics in Megatron's own TensorBoard and W&B writers, and its log.

Every ``--log-interval`` iterations the training iterator of each reader computes the
``zephon/`` metrics of :mod:`zephon.meter` (wait per microbatch, tokens/s, padding and
loss-bearing shares, realized vs target share per dataset, documents dropped and filtered)
and writes them, at that iteration, to the writers Megatron-LM made
(``get_tensorboard_writer()``, ``get_wandb_writer()``, which exist on the last rank) or to the
writer :func:`set_writer` gave (the CPU smoke run); data-parallel rank 0 also prints them as
one log line. At the end of the data the report is printed.

The iteration a microbatch belongs to is Megatron's, ramp included: :class:`StepClock` counts
each reader's microbatches the way Megatron's training loop consumes them. At the start of an
iteration Megatron sets the running global batch size from the samples consumed so far
(``--rampup-batch-size START INCREMENT SAMPLES`` grows it from START by INCREMENT every
``SAMPLES / ((GLOBAL - START) / INCREMENT)`` samples, megatron-core's
``RampupBatchsizeNumMicroBatchesCalculator``); every reader then reads ``running global batch
/ (micro batch x data-parallel size)`` microbatches, and the consumed samples grow by the
running global batch. The data order does not depend on it: readers hand out the same
microbatches in the same order whatever the batch size of the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_WRITERS: dict[str, Any] = {}


def set_writer(writer: Any) -> None:
    """Use ``writer`` (``add_scalar(tag, value, step)``) where Megatron-LM has none."""
    _WRITERS["tensorboard"] = writer


def writers() -> tuple[Any, Any]:
    """(TensorBoard writer, W&B run) of this process, either may be None."""
    try:
        from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

        tensorboard, wandb = get_tensorboard_writer(), get_wandb_writer()
    except (ImportError, AssertionError):
        tensorboard = wandb = None
    return tensorboard or _WRITERS.get("tensorboard"), wandb


def write(metrics: dict[str, float], iteration: int) -> bool:
    """Write ``metrics`` at ``iteration`` to this process's writers; True if any took them."""
    tensorboard, wandb = writers()
    if tensorboard is not None:
        for tag, value in metrics.items():
            tensorboard.add_scalar(tag, value, iteration)
    if wandb is not None:
        wandb.log(metrics, iteration)
    return tensorboard is not None or wandb is not None


def global_batch_schedule(global_batch_size: int, micro_batch_size: int, dp_size: int,
                          rampup: tuple[int, int, int] | None = None,
                          decrease_if_needed: bool = False) -> Callable[[int], int]:
    """Megatron's running global batch size as a function of the samples consumed before an
    iteration. With a ramp: megatron-core's own calculator (a private one; Megatron's global
    one is left alone); without: the global batch size. megatron-core 0.19 has no ramp
    calculator (``--rampup-batch-size`` is deprecated there and not applied; its
    ``--step-batch-size-schedule`` is not followed yet): the global batch size."""
    try:
        from megatron.core.num_microbatches_calculator import (
            RampupBatchsizeNumMicroBatchesCalculator,
        )
    except ImportError:  # megatron-core >= 0.19 dropped the ramp (it ignores the flag)
        rampup = None
    if rampup is None:
        return lambda consumed_samples: global_batch_size

    start, increment, samples = rampup
    calculator = RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size, micro_batch_size, dp_size, decrease_if_needed, -1, start, increment,
        samples)

    def running(consumed_samples: int) -> int:
        calculator.update(consumed_samples, consistency_check=False)
        return int(calculator.get_current_running_global_batch_size())

    return running


@dataclass
class StepClock:
    """Megatron's iteration number from the microbatches one reader hands out (see the
    module docstring for the rule)."""

    global_batch: Callable[[int], int]
    """Running global batch size (rows) for the samples consumed before an iteration."""
    rows_per_microbatch: int
    """Micro batch size x data-parallel size: rows of one microbatch on every reader."""
    ramp_samples: int = 0
    """Samples after which the global batch size stays constant (0: no ramp)."""
    iteration: int = 0
    """Iterations completed."""
    consumed_samples: int = 0
    """Samples of the completed iterations."""
    _left: int = 0

    def tick(self) -> int | None:
        """Count one handed-out microbatch; the iteration it completes, else None."""
        if self._left <= 0:
            self._left = self._microbatches(self.consumed_samples)
        self._left -= 1
        if self._left > 0:
            return None
        self.consumed_samples += self._rows(self.consumed_samples)
        self.iteration += 1
        return self.iteration

    def seek(self, consumed_samples: int) -> None:
        """Stand at the iteration boundary where ``consumed_samples`` were consumed (a resume):
        through the ramp one iteration at a time, after it by division."""
        iteration = consumed = 0
        while consumed < consumed_samples and consumed <= self.ramp_samples:
            consumed += self._rows(consumed)
            iteration += 1
        if consumed < consumed_samples:
            step = self._rows(consumed)
            iterations = -(-(consumed_samples - consumed) // step)
            iteration += iterations
            consumed += iterations * step
        self.iteration, self.consumed_samples, self._left = iteration, consumed, 0

    def _microbatches(self, consumed_samples: int) -> int:
        """Microbatches per reader of the iteration after ``consumed_samples`` (at least 1)."""
        return max(1, self.global_batch(consumed_samples) // self.rows_per_microbatch)

    def _rows(self, consumed_samples: int) -> int:
        """Samples that iteration consumes: Megatron adds micro batch x data-parallel size x
        microbatches to ``consumed_train_samples``."""
        return self._microbatches(consumed_samples) * self.rows_per_microbatch
