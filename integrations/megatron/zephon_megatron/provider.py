"""Dataset provider for Megatron's ``pretrain()``: train/valid/test iterators over Zephon.

Megatron calls the provider on tensor-parallel rank 0 of every pipeline stage (the provider's
``is_distributed`` is False) after it loaded the checkpoint, so ``args.iteration`` and
``args.consumed_train_samples`` are known. With ``--dataloader-type external`` the returned
objects reach the training loop as they are, wrapped in Megatron's ``RerunDataIterator``; they
are iterators, not DataLoaders, and each ``next()`` returns one microbatch in the Megatron
preset: ``tokens``, ``labels``, float ``loss_mask``, ``position_ids`` and, with document
masking, ``cu_seqlens`` (``[B, K]``, -1 after each row's end) and ``max_seqlen``.

Pipeline stages. Only stages that need microbatches build a pipeline
(:func:`~zephon_megatron.compat.stage_reads`): the first and the last, and every stage under
document masking (each stage's attention needs the boundaries). The provider returns no
iterators to the others; under virtual pipelining it is called once per model chunk.

Loader state. Megatron-LM checkpoints only counters; it calls ``save_state()`` on the training
iterator of every data-parallel rank and writes
``DIR/iter_<7 digits>/mp_rank_<tp>[_<pp>]/train_dataloader_dprank<dp>.pt``, where ``DIR`` is
``--dataloader-save`` or, without it, the checkpoint directory ``--save`` (the provider sets
``args.dataloader_save`` so; a resume then reads ``--load``). The state is keyed
per lane (``{"lane_<l>": entry}``), so on resume :func:`read_dataloader_states` reads *all*
ranks' files, merges the lanes and lets each rank take the ones it now owns: a run saved at
data-parallel size 8 resumes at 2 or 16 (any divisor of the lanes). The state describes what
the trainer consumed, never what the prefetch thread prepared. After restoring, the consumed
sample count must equal Megatron's ``consumed_train_samples``; a difference (a stale
``--dataloader-save`` directory, another batch size) is an error, never a silent restart.

Validation and test iterators read the validation and the test recipe and restart them every
``eval_iters * global_batch_size / (micro_batch_size * dp)`` microbatches (one evaluation), so
every evaluation, before and after a resume, scores the same data; they are not checkpointed.
The provider reads one window of each before training starts: a recipe that cannot fill an
evaluation is refused then, naming it and both counts, never repeated silently.

State files hold the kit's state envelope (:mod:`zephon.integration.state_envelope`: plain
data, sealed; token arrays as base64 text), so they load with
``torch.load(weights_only=True)``; the adapter's own fields (role, micro batch size, consumed
samples) ride in it. Limits: context parallelism is not supported.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zephon.errors import ConfigError, DataError, StateMismatchError
from zephon.integration import (
    EndOfRunReport,
    LoaderSession,
    TraceFile,
    global_rank,
    host_group,
    lanes_problem,
    rank_state,
    read_state,
)
from zephon.meter import metrics_line
from zephon_megatron.arguments import (
    ZephonArgumentError,
    ZephonSettings,
    settings_from_args,
    training_recipes,
)
from zephon_megatron.state_files import read_dataloader_states
from zephon_megatron.step_metrics import StepClock, global_batch_schedule
from zephon_megatron.tokenizer_checks import check_tokenizers, eod_id, megatron_tokenizer
from zephon_megatron.vocabulary import run_recipe


def blend_differences(settings: ZephonSettings) -> str:
    """What a run on Megatron's data flags does otherwise than Megatron's own loader, said at
    start-up: how the splits are made (the ``--split`` given, Megatron's default one, or
    per-split blends read whole) and the differences of mixing."""
    if settings.per_split is not None:
        splits = "each split's blend is read whole, as Megatron reads per-split blends"
    elif settings.split:
        splits = f"--split {settings.split} cuts documents with Megatron's rounding"
    else:
        from zephon_megatron.blend import DEFAULT_SPLIT

        splits = (f"Megatron's default split {DEFAULT_SPLIT} (no --split given) cuts documents "
                  "with Megatron's rounding")
    return ("zephon: the blend keeps Megatron's weights (by size where none are given) and "
            f"{splits}; unlike Megatron it mixes tokens, not samples of --seq-length, packs "
            "documents across samples, and repeats each dataset when it runs out")


@dataclass(frozen=True)
class Topology:
    """Where this reader sits among the data-parallel readers (tensor-parallel rank 0s)."""

    dp_rank: int = 0
    dp_size: int = 1
    dp_group: Any = None
    """Process group of the readers with this rank's (pipeline, context) coordinates; used to
    agree on the end of data. A gloo group where one exists (the agreement is a CPU tensor)."""


def topology_from_parallel_state() -> Topology:
    from megatron.core import parallel_state

    dp_size = parallel_state.get_data_parallel_world_size()
    group = None
    if dp_size > 1:
        try:
            group = parallel_state.get_data_parallel_group_gloo()
        except (AssertionError, RuntimeError):
            group = parallel_state.get_data_parallel_group()
    return Topology(parallel_state.get_data_parallel_rank(), dp_size, group)


# -- iterator ----------------------------------------------------------------------------------
class ZephonDataIterator:
    """Megatron microbatch dicts from a Zephon Pipeline, with ``save_state``/``restore_state``.

    ``restart_every``: start over after this many microbatches (evaluation windows); ``cycle``:
    start over at the end of data instead of raising StopIteration.
    """

    def __init__(self, pipeline: Any, to_training: dict[str, Any], *, micro_batch_size: int,
                 role: str = "train", source: str = "<recipe>",
                 restart_every: int | None = None, cycle: bool = False,
                 log_every: tuple[StepClock, int] | None = None, announce: bool = True,
                 metrics_group: Any = None, trace: Any = None,
                 end: tuple[int | None, int | None] = (None, None), row_tokens: int = 0):
        self.session = LoaderSession(pipeline, to_training, metrics_group=metrics_group)
        """The pipeline as the loop consumes it: tensors, job figures over ``metrics_group``
        (the readers' data-parallel gloo group, see :mod:`zephon.meter`), lane-keyed state."""
        self.pipeline = pipeline
        self.meter = self.session.meter
        self.log_every = log_every
        """(Megatron's iteration of each microbatch, Megatron's --log-interval; 0 logs
        nothing)."""
        self.end = end
        """(``--train-iters``, ``--train-samples``): the microbatch that completes them is
        the last of training, where the readers report the job together."""
        self.announce = announce
        """Print the metrics line (data-parallel rank 0)."""
        self._report = EndOfRunReport(self.meter, pipeline, group=metrics_group,
                                      rows=micro_batch_size, row_tokens=row_tokens,
                                      due=role == "train")
        """Printed once by global rank 0: job-wide where the readers end together (the last
        training microbatch, the end of the data), else for this rank's lanes when the
        iterator is dropped or at exit (a run stopped by Ctrl-C or an error)."""
        self._report.at_exit(self)
        if self._report.due:
            import weakref

            weakref.finalize(self, self._report.print, "end of training").atexit = False
        self.trace = trace
        """This rank's :class:`~zephon.integration.TraceFile`, or None."""
        self.micro_batch_size = micro_batch_size
        self.role = role
        self.source = source
        self.restart_every = restart_every
        self.cycle = cycle
        self.last_global_microbatch: int | None = None
        self._iterator: Iterator[Any] | None = None
        self._since_start = 0

    def __iter__(self) -> ZephonDataIterator:
        return self

    def _restart(self) -> None:
        self._iterator = None
        self.session.restart()
        self._since_start = 0

    def _next_batch(self) -> tuple[Any, dict[str, Any]]:
        if self.restart_every and self._since_start >= self.restart_every:
            self._restart()
        if self._iterator is None:
            self._iterator = self.session.batches(cycle=self.cycle)
        try:
            return next(self._iterator)
        except StopIteration:
            if self.restart_every:
                raise ConfigError(
                    f"{self.source}: the {self.role} data ends after {self._since_start} "
                    f"microbatches on this reader, but one evaluation reads {self.restart_every}"
                    " (--eval-iters x --global-batch-size / (--micro-batch-size x data-parallel"
                    " size)); give more data or lower --eval-iters") from None
            raise

    def __next__(self) -> dict[str, torch.Tensor]:
        try:
            batch, out = self._next_batch()
        except StopIteration:  # the readers agree on the end: they report the job together
            self._report.print("end of data", job=True)
            raise
        self._since_start += 1
        self.last_global_microbatch = batch.global_microbatch(self.pipeline.lanes)
        if self.trace is not None:
            options = self.pipeline.loader_options
            self.trace.write(batch, self.pipeline.lanes, options.dp_rank, options.dp_world_size,
                             {k: v for k, v in out.items() if isinstance(v, torch.Tensor)})
        self._maybe_log()
        return out

    def check_window(self) -> None:
        """Read one evaluation window and start over: a recipe too small for it fails here,
        before training, not at the first evaluation."""
        if not self.restart_every:
            return
        for _ in range(self.restart_every):
            self._next_batch()
            self._since_start += 1
        self._restart()

    def _maybe_log(self) -> None:
        if self.log_every is None:
            return
        clock, interval = self.log_every
        iteration = clock.tick()
        if iteration is None:
            return
        iters, samples = self.end
        if (iters and iteration >= iters) or (samples and clock.consumed_samples >= samples):
            self._report.print("end of training", job=True)
        if interval <= 0 or iteration % interval:
            return
        metrics = self.session.metrics()
        from zephon_megatron.step_metrics import write

        write(metrics, iteration)
        if self.announce:
            print(metrics_line(iteration, metrics), flush=True)


    def summarize(self, why: str = "last step") -> None:
        """Print, once, what this training iterator handed out (this rank's lanes)."""
        self._report.print(why)

    def close(self) -> None:
        """Stop the prefetch thread; the consumed state stays as it is."""
        self._iterator = None
        self.session.close()

    @property
    def consumed_samples(self) -> int:
        """Samples (rows) consumed by all data-parallel ranks together."""
        entry = next(iter(self.pipeline.state_dict().values()))
        return int(entry["consumed_global"]) * self.micro_batch_size

    def save_state(self) -> dict[str, Any]:
        """This rank's lanes, as consumed, in the kit's envelope; Megatron's
        ``--dataloader-save`` hook."""
        return rank_state(self.pipeline.state_dict(), lanes=self.pipeline.lanes, framework={
            "role": self.role, "micro_batch_size": self.micro_batch_size,
            "consumed_samples": self.consumed_samples})

    def restore_state(self, states: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Resume from one state or from the states of all ranks of the saving run (a lane
        written twice must agree: no stale files)."""
        found = read_state(states, "the Megatron loader state")
        for fields in found.framework:
            if fields.get("micro_batch_size") != self.micro_batch_size:
                raise StateMismatchError(
                    f"the loader state was written with --micro-batch-size "
                    f"{fields.get('micro_batch_size')}, this run has {self.micro_batch_size}; "
                    "the microbatches of every lane would differ")
        if not found.entries:
            raise StateMismatchError("restore_state got no loader state")
        self._iterator = None
        self.session.load_state_dict(found.entries)
        self._since_start = 0
        if self.log_every is not None:  # iterations already done, for the metrics' steps
            self.log_every[0].seek(self.consumed_samples)


# -- provider ----------------------------------------------------------------------------------
def preset_options(settings: ZephonSettings, recipe: Any) -> dict[str, Any]:
    """The ``to_training`` arguments of the Megatron preset under this run's masking: the
    recipe's table completed by the preset (:data:`zephon.recipe.presets.MEGATRON`), the
    masking Megatron's flags chose, and Megatron's tensor names."""
    from zephon.recipe.presets import MEGATRON

    masking = settings.masking
    eos = eod_id(recipe, megatron_tokenizer()) if masking.eos_mask_loss else None
    return MEGATRON.training_options(recipe, {
        "position_mode": masking.position_mode, "return_cu_seqlens": masking.document_masking,
        "eos_mask_loss": masking.eos_mask_loss, "eos_token_id": eos,
        "rename_fields": {"input_ids": "tokens", "positions": "position_ids"}})


def build_iterator(recipe: Any, settings: ZephonSettings, topology: Topology, *,
                   role: str = "train", restart_every: int | None = None,
                   cycle: bool = False) -> ZephonDataIterator:
    problem = lanes_problem(settings.lanes, topology.dp_size)
    if problem:
        raise ZephonArgumentError(f"{recipe.source}: {problem} (--zephon-lanes or the "
                                  "recipe's lanes)")
    pipeline = recipe.build(seq_len=settings.seq_length,
                            microbatch_size=settings.micro_batch_size,
                            dp_rank=topology.dp_rank, dp_world_size=topology.dp_size,
                            lanes=settings.lanes, process_group=topology.dp_group,
                            prefetch=settings.prefetch, workers=settings.workers)
    log_every = None
    if role == "train":
        log_every = (step_clock(settings, topology.dp_size), settings.log_interval or 0)
    return ZephonDataIterator(pipeline, preset_options(settings, recipe),
                              micro_batch_size=settings.micro_batch_size, role=role,
                              source=recipe.source, restart_every=restart_every, cycle=cycle,
                              log_every=log_every, announce=topology.dp_rank == 0,
                              end=(settings.train_iters, settings.train_samples),
                              row_tokens=settings.seq_length + 1,
                              metrics_group=host_group(topology.dp_group),
                              trace=TraceFile.open(settings.trace_dir) if role == "train"
                              else None)


def step_clock(settings: ZephonSettings, dp_size: int) -> StepClock:
    """Megatron's iterations for this run's batch sizes (``--rampup-batch-size`` included)."""
    rows = settings.micro_batch_size * dp_size
    ramp = settings.rampup_batch_size
    schedule = global_batch_schedule(settings.global_batch_size or rows,
                                     settings.micro_batch_size, dp_size, ramp,
                                     settings.decrease_batch_size_if_needed)
    return StepClock(schedule, rows, ramp_samples=ramp[2] if ramp else 0)


def restore_for_resume(iterator: ZephonDataIterator, settings: ZephonSettings,
                       iteration: int, consumed_train_samples: int) -> None:
    """Load the loader state of ``iteration`` and check it against Megatron's counter."""
    if iteration <= 0 and consumed_train_samples <= 0:
        return
    if not settings.dataloader_load:
        raise ZephonArgumentError(
            f"resuming at iteration {iteration} ({consumed_train_samples} consumed samples) "
            "needs the loader state: pass --load (the checkpoint holds it) or --dataloader-save "
            "DIR, the directory the checkpoint was saved with")
    iterator.restore_state(read_dataloader_states(settings.dataloader_load, iteration))
    if iterator.consumed_samples != consumed_train_samples:
        raise StateMismatchError(
            f"the loader state in {settings.dataloader_load} (iteration {iteration}) consumed "
            f"{iterator.consumed_samples} samples, but the checkpoint's consumed_train_samples "
            f"is {consumed_train_samples}; the states come from different runs or steps")


class ZephonDatasetsProvider:
    """``train_valid_test_datasets_provider`` for ``pretrain()`` and the CPU smoke run.

    ``get_args`` returns the parsed command line (Megatron's ``get_args`` under ``pretrain()``);
    ``topology`` where this rank reads (default: megatron-core's parallel_state).
    """

    is_distributed = False
    """Megatron calls the provider on tensor-parallel rank 0 only; the others get batches by
    broadcast in get_batch."""

    def __init__(self, get_args: Callable[[], argparse.Namespace],
                 topology: Callable[[], Topology] = topology_from_parallel_state,
                 stage_reads: Callable[[int | None, bool], bool] | None = None):
        self._get_args = get_args
        self._topology = topology
        self._stage_reads = stage_reads

    command_line: tuple[str, ...] | None = None
    """The run's Megatron flags (the entry sets them): global rank 0 writes them with the
    recipe and sizes into the run record of ``--save``, for ``zephon trace``
    (:class:`zephon.integration.RunRecord`). None: no record."""

    exit_on_error = False
    """Under ``pretrain()`` (the entry sets it): a problem found here is printed by global
    rank 0 alone, without a traceback, and every rank that finds it exits with status 2.
    Elsewhere (tests, the CPU smoke run) it is raised."""

    def __call__(self, train_val_test_num_samples: Sequence[int | None] | None = None,
                 vp_stage: int | None = None) -> tuple[ZephonDataIterator | None,
                                                       ZephonDataIterator | None,
                                                       ZephonDataIterator | None]:
        try:
            return self._iterators(vp_stage)
        except (ConfigError, DataError, StateMismatchError) as exc:
            if not self.exit_on_error:
                raise
            if global_rank() == 0:
                import sys

                print(f"zephon_megatron: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    def _record(self, args: argparse.Namespace, settings: ZephonSettings,
                train: ZephonDataIterator) -> None:
        """The run record in ``--save`` (global rank 0; see :attr:`command_line`)."""
        save = getattr(args, "save", None)
        if self.command_line is None or not save or global_rank() != 0:
            return
        import os

        from zephon.integration import RunRecord

        mbs, dp = settings.micro_batch_size, train.pipeline.loader_options.dp_world_size
        RunRecord(framework="megatron", lanes=train.pipeline.lanes, dp_size=dp,
                  recipe=os.path.abspath(settings.recipe) if settings.recipe and not (
                      settings.data_path or settings.per_split) else None,
                  microbatch_size=mbs, seq_len=settings.seq_length,
                  microbatches_per_step=(settings.global_batch_size or mbs * dp) // mbs,
                  checkpoints=".", flags=self.command_line).write(save)

    def _iterators(self, vp_stage: int | None) -> tuple[ZephonDataIterator | None,
                                                         ZephonDataIterator | None,
                                                         ZephonDataIterator | None]:
        args = self._get_args()
        settings = settings_from_args(args)
        # Megatron-LM's checkpoint hook writes the loader state where the settings say.
        args.dataloader_save = settings.dataloader_save
        if self._stage_reads is None:
            from zephon_megatron.compat import stage_reads
        else:
            stage_reads = self._stage_reads
        if not stage_reads(vp_stage, settings.masking.document_masking):
            return None, None, None
        topology = self._topology()
        recipes = training_recipes(settings)
        if (settings.data_path or settings.per_split) and global_rank() == 0:
            print(blend_differences(settings), flush=True)
        recipe = run_recipe(recipes["train"], args)
        check_tokenizers(recipe, args, megatron_tokenizer())
        train = build_iterator(recipe, settings, topology)
        self._record(args, settings, train)
        restore_for_resume(train, settings, int(getattr(args, "iteration", 0) or 0),
                           int(getattr(args, "consumed_train_samples", 0) or 0))
        evaluation: dict[str, ZephonDataIterator | None] = {"valid": None, "test": None}
        eval_iters = int(getattr(args, "eval_iters", 0) or 0)
        if eval_iters > 0:
            window = None
            if settings.global_batch_size:
                window = eval_iters * settings.global_batch_size // (
                    settings.micro_batch_size * topology.dp_size)
            for role in evaluation:
                if recipes[role] is not None:
                    evaluation[role] = iterator = build_iterator(
                        run_recipe(recipes[role], args), settings, topology, role=role,
                        restart_every=window)
                    iterator.check_window()
        return train, evaluation["valid"], evaluation["test"]
