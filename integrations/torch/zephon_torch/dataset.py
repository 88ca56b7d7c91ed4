"""A data recipe (or a ``Pipeline`` built in Python) as a ``torch.utils.data.IterableDataset``
of microbatches, with state.

Each item is one microbatch of this reader: the dict ``SampleBatch.to_training`` returns under
the recipe's ``[to_training]`` options, or a pipeline's ``to_training`` argument
(``input_ids``, ``labels``, ... as ``[microbatch_size, seq_len]`` tensors unless the options
flatten); a ``DataLoader`` takes it with ``batch_size=None``. Microbatch ``m`` of the job goes
to reader ``m % dp_size``: the same global microbatches at every size dividing the lanes.

- readers: ``geometry``, else :meth:`RunGeometry.from_environment`; several readers need
  ``torch.distributed`` initialized (they agree on the end of the data, sum the metrics);
- lanes: :func:`choose_lanes` (the recipe's or pipeline's, ``lanes=``, a loaded state's);
- the pipeline is built on first use, in the process that iterates (a worker builds its own);
- state: :meth:`ZephonIterableDataset.state_dict`, the kit's envelope of what was handed out
  (:mod:`zephon.integration.state_envelope`). ``state_scope="rank"`` (default): this reader's
  lanes, for per-rank checkpoints (``StatefulDataLoader``, DCP; resume at another size from
  the list of every rank's). ``"job"``: every reader's lanes on each rank, gathered as JSON (a
  collective), for one file from the main process (``accelerate``'s ``save_state``);
- ``len()``: microbatches per reader in one pass, where the data makes it exact.

Where the state lives: with a ``DataLoader`` worker, in the worker. torchdata's
``StatefulDataLoader`` asks the worker for it; a plain ``DataLoader`` cannot, so
:meth:`ZephonIterableDataset.state_dict` in the main process, once a worker handed out items,
is an error naming the fix (a state of position 0 would replay the run from its start).

Limits: one ``DataLoader`` worker at most (the recipe's ``workers`` runs the document
operators in processes); model-parallel layouts pass their ``geometry``; ``accelerate``'s
``prepare`` is refused (it would dispatch or shard the microbatches a second time).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing.context import get_spawning_popen
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from zephon import Pipeline
from zephon.distributed import startup
from zephon.errors import ConfigError
from zephon.integration import (
    LoaderSession,
    RunGeometry,
    choose_lanes,
    data_supply,
    job_state,
    lanes_problem,
    rank_state,
    read_state,
    reader_group,
)
from zephon.recipe import DataRecipe

STATE_SCOPES = ("rank", "job")


class ZephonIterableDataset(IterableDataset):
    """A data recipe's microbatches for this reader; see the module docstring."""

    def __init__(self, recipe: str | os.PathLike[str] | DataRecipe | Pipeline, *,
                 seq_len: int | None = None, microbatch_size: int | None = None,
                 lanes: int | None = None, geometry: RunGeometry | None = None,
                 prefetch: int | None = None, infinite: bool = False,
                 state_scope: str = "rank",
                 to_training: dict[str, Any] | None = None) -> None:
        """``recipe``: a data recipe (TOML path or :class:`DataRecipe`), or a
        :class:`~zephon.Pipeline` built in Python (its ``options`` give the lanes and
        prefetch; this dataset sets the reader's rank and size). ``seq_len``: tokens per row
        the model takes (rows are packed to ``seq_len + 1``) unless the recipe's ``[pack]
        max_length`` fixes it; ``microbatch_size``: rows per item unless ``[batch]
        microbatch_size`` does (given both, they must agree); a pipeline fixes both itself.
        ``to_training``: ``SampleBatch.to_training`` options of a pipeline's items (a recipe
        has its ``[to_training]``). ``infinite``: start the data over at its end."""
        if state_scope not in STATE_SCOPES:
            raise ConfigError(f"state_scope must be one of {STATE_SCOPES}, got {state_scope!r}")
        self.pipeline: Pipeline | None = recipe if isinstance(recipe, Pipeline) else None
        if self.pipeline is not None:
            given = [n for n, v in (("seq_len", seq_len), ("microbatch_size", microbatch_size))
                     if v is not None]
            if given:
                raise ConfigError(f"ZephonIterableDataset(pipeline, {given[0]}=...): a pipeline "
                                  "fixes its rows and microbatches itself (pack_flat, batch)")
            self.recipe = None
            self.training = dict(to_training or {})
        else:
            if to_training is not None:
                raise ConfigError("ZephonIterableDataset(recipe, to_training=...): a recipe's "
                                  "items follow its [to_training] table")
            self.recipe = recipe if isinstance(recipe, DataRecipe) else \
                DataRecipe.from_toml(recipe)
            self.training = self.recipe.training_options()
        self.seq_len, self.microbatch_size = seq_len, microbatch_size
        self.lanes, self.geometry, self.prefetch = lanes, geometry, prefetch
        self.infinite, self.state_scope = infinite, state_scope
        self._session: LoaderSession | None = None
        self._pending: Any = None
        """A state loaded before the pipeline exists, as given."""
        self._handed: Any = multiprocessing.RawValue("q", 0)
        """Items handed out by whichever process iterates this dataset (a worker's copy
        shares it): the main process sees that its own state is not what was delivered."""

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        _refuse_accelerate_prepare()
        for _, item in self._open().batches(cycle=self.infinite):  # infinite: start over
            if self._handed is not None:
                self._handed.value += 1
            yield item

    def _open(self) -> LoaderSession:
        if self._session is None:
            with startup():  # the readers start together: a failure is named to the others
                self._session = self._start()
        return self._session

    def _start(self) -> LoaderSession:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise ConfigError(
                f"ZephonIterableDataset in a DataLoader with num_workers={worker.num_workers}: "
                "each worker would read the same lanes. Use num_workers=0 or 1, and the "
                "recipe's `workers` to run tokenizing in processes")
        geometry = self.geometry or RunGeometry.from_environment()
        pending = None if self._pending is None else read_state(
            self._pending, "ZephonIterableDataset.load_state_dict")
        if self.pipeline is not None:
            own, source = self.pipeline.loader_options.lanes, "the pipeline"
        else:
            own, source = self.recipe.lanes, self.recipe.source
        choice = choose_lanes(geometry.dp_size, recipe=own, option=self.lanes,
                              option_name="ZephonIterableDataset(lanes=...)",
                              saved=pending and pending.lane_count, source=source)
        problem = lanes_problem(choice.lanes, geometry.dp_size)
        if problem:
            raise ConfigError(f"{problem}; the lanes are {choice.why}")
        group = reader_group(geometry.dp_size, required=True)
        if self.pipeline is not None:
            pipeline = self.pipeline.options(
                dp_rank=geometry.dp_rank, dp_world_size=geometry.dp_size, lanes=choice.lanes,
                prefetch=self.prefetch, process_group=group)
        else:
            pipeline = self.recipe.build(
                seq_len=self.seq_len, microbatch_size=self.microbatch_size,
                dp_rank=geometry.dp_rank, dp_world_size=geometry.dp_size, lanes=choice.lanes,
                prefetch=self.prefetch, process_group=group)
        session = LoaderSession(pipeline, self.training, metrics_group=group)
        if pending is not None:
            session.load_state_dict(pending.entries)
            self._pending = None
        return session

    def metrics(self) -> dict[str, float]:
        """The job's ``zephon/`` figures since the last call (see :mod:`zephon.meter`); with
        several readers a collective: call it on every rank at the same step."""
        return self._open().metrics()

    def __len__(self) -> int:
        """Microbatches this reader hands out in one pass where the data makes it exact: one
        Megatron indexed dataset, not repeated, packed with ``wrap``, no ``[[ops]]``
        (:func:`zephon.integration.data_supply`). Otherwise a TypeError, as for any iterable
        without a length (progress bars then count without a total)."""
        if self.infinite or self.recipe is None:
            raise TypeError("ZephonIterableDataset has no length: " + (
                "infinite=True starts over at the end" if self.infinite else
                "a pipeline built in Python is not counted (a recipe of one indexed dataset is)"))
        dp = (self.geometry or RunGeometry.from_environment()).dp_size
        lanes = choose_lanes(dp, recipe=self.recipe.lanes, option=self.lanes).lanes
        mbs = self.recipe.batch.microbatch_size or self.microbatch_size
        pipeline = self.recipe.build(seq_len=self.seq_len, microbatch_size=mbs, lanes=lanes,
                                     prefetch=0)  # names a size left open
        row = (self.recipe.pack.max_length if self.recipe.pack else None) or self.seq_len + 1
        supply = data_supply(self.recipe, pipeline, row, mbs, dp)
        if supply is None or not supply.exact:
            raise TypeError("ZephonIterableDataset has no length: the data repeats, or its "
                            "size is only estimated (one indexed dataset read once is counted)")
        return supply.rows // mbs // dp

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state envelope of the microbatches handed out: this reader's lanes, or every
        reader's under ``state_scope="job"`` (a collective)."""
        if self._session is None and self._handed is not None and self._handed.value:
            raise ConfigError(
                "ZephonIterableDataset.state_dict(): a DataLoader worker handed the items out "
                "and holds the state; this process's copy has read nothing, and its state would "
                "replay the run from its start. Use torchdata's StatefulDataLoader(dataset, "
                "batch_size=None, num_workers=1), which carries the worker's, or num_workers=0")
        if self._session is None and self._pending is not None and self.state_scope == "rank":
            return self._pending
        session = self._open()
        lanes = session.pipeline.lanes
        if self.state_scope == "rank":
            return rank_state(session.state_dict(), lanes=lanes)
        return job_state(session.state_dict(), lanes=lanes,
                         group=session.pipeline.loader_options.process_group)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after the microbatches ``state`` describes (any form of
        :func:`zephon.integration.read_state`: an envelope, the list of every rank's, a
        ``"job"`` state, bare lane entries). It must hold this reader's lanes; one written at
        another data-parallel size resumes too."""
        if self._session is None:
            self._pending = state
        else:
            self._session.load_state_dict(
                read_state(state, "ZephonIterableDataset.load_state_dict").entries)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (a DataLoader worker's) resumes where this one is; it builds its own
        pipeline."""
        copied = dict(self.__dict__)
        if self._session is not None:
            copied["_pending"] = self._session.state_dict()
        copied["_session"] = None
        if get_spawning_popen() is None:  # shared memory travels only to a starting process
            copied["_handed"] = None
        return copied


def _refuse_accelerate_prepare() -> None:
    """A ConfigError when the caller is ``accelerate``'s prepared DataLoader (its dispatcher
    or its shard of an iterable dataset), found among the calling frames."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return
        if frame.f_globals.get("__name__", "").startswith("accelerate.data_loader"):
            raise ConfigError(
                "ZephonIterableDataset in a DataLoader passed to accelerator.prepare: the "
                "dataset already reads this process's share of the microbatches, and prepare "
                "would dispatch or shard them again (with dispatching, only process 0 reads "
                "and the other processes' readers wait for it). Iterate the DataLoader (or "
                "the dataset) without prepare, and register the dataset with "
                "accelerator.register_for_checkpointing(dataset)")
        frame = frame.f_back
