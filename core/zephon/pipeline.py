"""``Pipeline``: the public, immutable builder.

A pipeline is a work source, a chain of operators and the loader options. Every builder call
(``tokenize``, ``map``, ``pack_flat``, ``batch``, ``options``, ``apply``, ...) returns a new
pipeline and leaves this one unchanged; the operator methods take exactly their spec's fields
(see :mod:`zephon.ops`), and ``apply(spec)`` adds any operator, including ones defined outside
Zephon. Order rules (tokenize before pack, batch last, ...) are checked as operators are added.

Nothing is read until the pipeline is used: ``loader()`` builds the runtime
(:class:`zephon.runtime.Loader`) once per pipeline object, and iterating, ``state_dict``,
``load_state_dict``, ``report`` and ``estimate`` go through it. A new ``iter()`` continues
from the consumed state; ``reset()`` starts over.

A pipeline derived from one whose loader had state loaded carries that state over: its loader
starts from the parent's consumed state, or refuses it (StateMismatchError naming what changed)
when the change alters the data. Nothing silently restarts from the beginning.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec

from zephon.errors import ConfigError
from zephon.io.store_options import StoreOptions
from zephon.loader_options import LoaderOptions
from zephon.ops.base import OperatorSpec, check_order
from zephon.ops.batch import BatchSpec
from zephon.ops.filter import FilterSpec
from zephon.ops.map import MapSpec
from zephon.ops.pack import PackFlatSpec, PackSequencesSpec
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.ops.shuffle import ShuffleSpec
from zephon.ops.tokenize import TokenizeSpec
from zephon.ops.tokenize_chat import TokenizeChatSpec
from zephon.report import PipelineReport
from zephon.runtime import Loader
from zephon.sample_batch import SampleBatch
from zephon.work.estimation import DatasetEstimate
from zephon.work.protocol import WorkSource, work_source_problem

P = ParamSpec("P")


def _operator_method(spec_cls: Callable[P, OperatorSpec], name: str, doc: str
                     ) -> Callable[Concatenate[Pipeline, P], Pipeline]:
    """A builder method that takes exactly the spec's fields: type checkers and editors see
    them through ``P``, and ``help()`` through ``__signature__``."""

    def method(self: Pipeline, *args: P.args, **kwargs: P.kwargs) -> Pipeline:
        spec = spec_cls(*args, **kwargs)
        return self.apply(spec)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  *inspect.signature(spec_cls).parameters.values()]
    method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation="Pipeline")
    method.__name__ = method.__qualname__ = name
    target = f"{spec_cls.__module__}.{getattr(spec_cls, '__name__', spec_cls)}"
    method.__doc__ = f"{doc}\n\nOptions: see :class:`{target}`."
    return method


class Pipeline:
    """A loader pipeline over a work source; see the module docstring."""

    def __init__(self, work_source: WorkSource):
        problem = work_source_problem(work_source)
        if problem:
            raise ConfigError(f"Pipeline needs a work source such as StaticMixtureWorkSource: "
                              f"{problem}")
        self._work_source = work_source
        self._specs: tuple[OperatorSpec, ...] = ()
        self._options = LoaderOptions()
        self._carried: dict[str, Any] | None = None
        self._loader: Loader | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a DataLoader worker) is the description alone: it
        builds its own loader there."""
        state = dict(self.__dict__)
        state["_loader"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def work_source(self) -> WorkSource:
        return self._work_source

    @property
    def operators(self) -> tuple[OperatorSpec, ...]:
        """The operator specs, in order."""
        return self._specs

    @property
    def loader_options(self) -> LoaderOptions:
        return self._options

    # -- building --------------------------------------------------------------------------
    def _derive(self, specs: tuple[OperatorSpec, ...], options: LoaderOptions) -> Pipeline:
        clone = Pipeline.__new__(Pipeline)
        clone._work_source = self._work_source
        clone._specs = specs
        clone._options = options
        clone._loader = None
        clone._lock = threading.Lock()
        clone._carried = self._carried
        if self._loader is not None and self._loader.state_loaded:
            clone._carried = self._loader.state_dict()
        return clone

    def apply(self, spec: OperatorSpec) -> Pipeline:
        """A pipeline with ``spec`` appended; any :class:`zephon.ops.base.OperatorSpec`."""
        if not isinstance(spec, OperatorSpec):
            raise ConfigError(f"apply() needs an operator spec (a zephon.ops.base.OperatorSpec),"
                              f" got {type(spec).__name__}")
        spec.check_filled()
        check_order(self._specs, spec)
        return self._derive((*self._specs, spec), self._options)

    def options(self, io_options: StoreOptions | None = None, **options: Any) -> Pipeline:
        """Storage, lanes, read-ahead and this process's place among the data-parallel ranks;
        the keywords are :class:`zephon.loader_options.LoaderOptions` fields (``lanes``,
        ``dp_rank``, ``dp_world_size``, ``prefetch``, ``process_group``). Unset ones keep
        their value."""
        if io_options is not None:
            options["io_options"] = io_options
        known = {f.name for f in dataclasses.fields(LoaderOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"options() got unexpected keyword argument(s) {unknown}; known: "
                            f"{sorted(known)}")
        changes = {k: v for k, v in options.items() if v is not None}
        return self._derive(self._specs, dataclasses.replace(self._options, **changes))

    tokenize = _operator_method(
        TokenizeSpec, "tokenize", "Encode the text column ``field`` into token ids.")
    tokenize_chat = _operator_method(
        TokenizeChatSpec, "tokenize_chat",
        "Render and encode conversations with assistant-only train masks.")
    pretokenized = _operator_method(
        PretokenizedSpec, "pretokenized",
        "Read documents that are token ids already (a list<int> column, or a Megatron indexed "
        "dataset), in place of tokenize.")
    map = _operator_method(MapSpec, "map", "Apply ``fn`` to every document before packing.")
    filter = _operator_method(FilterSpec, "filter",
                              "Keep the documents ``fn`` accepts; rejected ones are counted.")
    pack_flat = _operator_method(PackFlatSpec, "pack_flat",
                                 "Pack documents into fixed-length rows.")
    pack_sequences = _operator_method(
        PackSequencesSpec, "pack_sequences", "Group documents into rows of at most "
        "``max_length`` tokens, kept as lists.")
    shuffle = _operator_method(ShuffleSpec, "shuffle", "Seeded buffer shuffle of rows.")
    batch = _operator_method(BatchSpec, "batch",
                             "Group rows into SampleBatch objects; the last operator.")

    # -- runtime ---------------------------------------------------------------------------
    def loader(self) -> Loader:
        """This pipeline's runtime, built on first use (operators, tokenizer, unit plan)."""
        with self._lock:
            if self._loader is None:
                loader = Loader(self._work_source, self._specs, self._options)
                if self._carried is not None:
                    loader.load_state_dict(self._carried)
                self._loader = loader
        return self._loader

    @property
    def lanes(self) -> int:
        return self._options.resolved_lanes

    def __iter__(self) -> Iterator[SampleBatch]:
        return iter(self.loader())

    def reset(self) -> None:
        """Start over from the beginning of the data at the next ``iter()``."""
        self.loader().reset()

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must match to resume (datasets, operators, seed, lanes)."""
        return self.loader().fingerprint()

    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": entry}`` for this rank's lanes; see :meth:`Loader.state_dict`."""
        return self.loader().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``, written at any data-parallel size dividing the lane count."""
        self.loader().load_state_dict(state)

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuse ``state`` as :meth:`load_state_dict` would, without reading data or
        changing anything: a preflight for a resume (see :meth:`Loader.check_state`)."""
        self.loader().check_state(state)

    def estimate(self) -> list[DatasetEstimate]:
        """Estimated documents and tokens per dataset, before training."""
        return self.loader().estimate()

    def report(self) -> PipelineReport:
        """Per-dataset documents, tokens, realized shares, drops, for this rank's lanes."""
        return self.loader().report()
