"""The integration kit: what every framework adapter needs, written once.

An adapter is its framework's glue (config, hooks, tensor names); everything a trainer needs
from a loader whatever the framework is here, each in one module:

- :mod:`~zephon.integration.geometry`: the global rank, the data-parallel rank and size
  (:class:`RunGeometry`), and the readers' host group (:func:`reader_group`,
  :func:`metrics_group`, :func:`host_group`);
- :mod:`~zephon.integration.lanes`: the lane count of a run and why (:func:`choose_lanes`),
  and the lane count a saved state was written with (:func:`saved_lanes`);
- :mod:`~zephon.integration.session`: :class:`LoaderSession`, one rank's pipeline as the
  loop consumes it: ``to_training`` tensors, job-wide ``zephon/`` metrics, the state of what
  was consumed, and the data started over at its end (``batches(cycle=True)``);
- :mod:`~zephon.integration.state_envelope`: one versioned, sealed envelope of plain data for
  the loader state, per rank, job-wide (gathered as JSON) or per lane for DCP, and one reader
  for all of them (:func:`read_state`);
- :mod:`~zephon.integration.run_report`: the end-of-run report, job-wide where the readers
  end together, printed once by global rank 0 (:class:`EndOfRunReport`);
- :mod:`~zephon.integration.eos_checks`: the EOS id a loss mask masks after, against
  token-id data (:func:`eos_range_problem`, :func:`document_end_problems`, both:
  :func:`eos_mask_problems`);
- :mod:`~zephon.integration.batch_checks`: every training batch checked on its way to the
  trainer (:func:`check_training_batch`);
- :mod:`~zephon.integration.trace_file`: the per-rank trace file (:class:`TraceFile`);
- :mod:`~zephon.integration.tokenizer_check`: the framework's tokenizer against the recipe's
  (:func:`tokenizer_mismatch`);
- :mod:`~zephon.integration.data_amount`: whether the training data lasts the run
  (:func:`data_supply`);
- :mod:`~zephon.integration.preflight`: the resume checked before the model is built
  (:func:`resume_problems`) and one list of problems for the job (:func:`refusal`);
- :mod:`~zephon.integration.run_record`: what a run's folder says about its data
  (:class:`RunRecord`), so that tools take the run (``zephon trace RUN_DIR``);
- the recipe against the run before the model is built: :class:`FrameworkValues` and
  :func:`check_recipe`, with each framework's ``[to_training]`` preset
  (:data:`~zephon.recipe.presets.PRESETS`, :meth:`TrainingPreset.training_options
  <zephon.recipe.presets.TrainingPreset.training_options>`).

Nothing here changes the environment; adapters pass what their framework knows.
"""

from __future__ import annotations

from zephon.integration.batch_checks import check_training_batch, training_batch_problems
from zephon.integration.data_amount import DataSupply, data_supply
from zephon.integration.eos_checks import (
    document_end_problems,
    eos_mask_problems,
    eos_range_problem,
    indexed_prefixes,
)
from zephon.integration.geometry import (
    RunGeometry,
    distributed,
    global_rank,
    host_group,
    metrics_group,
    reader_group,
)
from zephon.integration.lanes import LaneChoice, choose_lanes, lanes_problem, saved_lanes
from zephon.integration.preflight import refusal, resume_problems
from zephon.integration.run_record import RunRecord
from zephon.integration.run_report import EndOfRunReport
from zephon.integration.session import LoaderSession
from zephon.integration.state_envelope import (
    LoaderState,
    job_state,
    merge_states,
    rank_state,
    read_state,
    state_as_text,
    state_from_text,
)
from zephon.integration.tokenizer_check import tokenizer_mismatch
from zephon.integration.trace_file import TraceFile
from zephon.recipe import FrameworkValues, ResolvedRecipe
from zephon.recipe.checks import check_recipe

__all__ = [
    "DataSupply",
    "EndOfRunReport",
    "FrameworkValues",
    "LaneChoice",
    "LoaderSession",
    "LoaderState",
    "ResolvedRecipe",
    "RunGeometry",
    "RunRecord",
    "TraceFile",
    "check_recipe",
    "check_training_batch",
    "choose_lanes",
    "data_supply",
    "distributed",
    "document_end_problems",
    "eos_mask_problems",
    "eos_range_problem",
    "global_rank",
    "host_group",
    "indexed_prefixes",
    "job_state",
    "lanes_problem",
    "merge_states",
    "metrics_group",
    "rank_state",
    "read_state",
    "reader_group",
    "refusal",
    "resume_problems",
    "saved_lanes",
    "state_as_text",
    "state_from_text",
    "tokenizer_mismatch",
    "training_batch_problems",
]
