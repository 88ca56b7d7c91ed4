"""The operator contract: specs, the operators built from them, and the nodes lanes run.

An operator lives in one module under ``zephon.ops`` and has three parts:

- a **spec**: a frozen dataclass subclassing :class:`OperatorSpec`, one documented field per
  option, validated in ``__post_init__``. The recipe schema is derived from these fields (see
  :mod:`zephon.recipe`), so a new field is a new recipe key.
- an **operator**: what ``spec.build(context)`` returns once per loader, shared by its lanes.
  It holds loaded resources (a tokenizer) and gives the fingerprint fields that a resume must
  find unchanged (:meth:`Operator.fingerprint`; by default the spec's fields).
- for row operators, a **node** per lane: a pull iterator over its upstream node with
  ``next()`` and plain-data ``snapshot()`` / ``restore()``.

Two kinds of operator:

- **Document operators** (``stage = "document"``: map, filter, tokenize, tokenize_chat) act on
  one document at a time, before mixing, inside each dataset's source. They must be pure
  functions of the document (no state, no randomness of their own); that is what makes them
  free to checkpoint: a resumed source re-reads its unit and re-applies them. They take
  documents in batches (``apply``) so that tokenizers can batch-encode.
- **Row operators** (``stage = "row"``: pack, shuffle; ``stage = "batch"``: batch) run after the
  mixer, one node per lane; their state is what their snapshots hold.

Order rules are declared, not fixed: a spec says its stage (document < row < batch), whether it
needs token ids (``needs_tokens``), makes them (``makes_tokens``), makes rows from documents
(``makes_rows``) and whether it may appear once (``once``). :func:`check_order` turns
violations into errors naming both operators.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.errors import ConfigError
from zephon.field_checks import (
    StateFieldError,
    item,
    need_bool,
    need_dict,
    need_list,
    record_from_state,
)
from zephon.named_objects import Registry
from zephon.records import Doc, Record

STAGES = ("document", "row", "batch")


@dataclass(frozen=True, slots=True)
class Dropped:
    """A document operator's verdict that a document goes no further, and why.

    ``reason`` becomes a count in the pipeline report (``skipped`` per dataset)."""

    reason: str


class LazyPieces:
    """The pieces of one long document, made as they are taken rather than all at once.

    A document operator may return it in place of a list when holding every piece would cost
    memory in proportion to the document (``tokenize`` does for long texts with
    ``max_document_tokens``). Iterating calls ``make()`` afresh and yields the pieces in order,
    so a resume inside the document makes them again instead of holding them. It is kept lazy
    only where the operator is the dataset's last document operator in the lanes' own
    process; elsewhere it is turned into a list."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Iterator[Doc]]):
        self.make = make

    def __iter__(self) -> Iterator[Doc]:
        return self.make()


Outcome = list[Doc] | LazyPieces | Dropped
"""What a document operator makes of one document: zero or more documents, or a drop."""


@dataclass
class BuildContext:
    """What operators may need when built: filled in as the chain is built, in order."""

    seed: int
    """The work source's seed."""
    lanes: int
    """Lanes of the run."""
    encoder: Any = None
    """The tokenizing operator's text encoder (``zephon.text.tokenizer.TextEncoder``), once
    built."""
    special: Any = None
    """The special token ids (``zephon.text.tokenizer.SpecialTokens``) of the tokens, once known."""


OPERATORS: Registry[type[OperatorSpec]] = Registry("operator")
"""Every operator spec class by ``op_name``, registered as the class is defined."""


class OperatorSpec(ABC):
    """Base of every operator spec. Subclasses are frozen dataclasses and set the class
    attributes below; defining one registers its ``op_name`` for recipes' ``[[ops]]``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("op_name")
        if not isinstance(name, str):
            return
        known = OPERATORS.get(name) if name in OPERATORS else None
        if known is not None and (known.__module__, known.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise ConfigError(f"operator name {name!r} of {cls.__module__}.{cls.__qualname__} "
                              f"is taken by {known.__module__}.{known.__qualname__}")
        OPERATORS.register(name, cls)

    op_name: ClassVar[str]
    """The builder method and recipe name, e.g. ``"pack_flat"``."""
    title: ClassVar[str]
    """How messages name the operator's options, e.g. ``"packing"``."""
    stage: ClassVar[str]
    """``"document"``, ``"row"`` or ``"batch"``."""
    needs_tokens: ClassVar[bool] = False
    """Only valid after a tokenizing operator."""
    makes_tokens: ClassVar[bool] = False
    """Turns text into token ids (at most one such operator per pipeline)."""
    once: ClassVar[bool] = True
    """May appear at most once in a pipeline."""
    makes_rows: ClassVar[bool] = False
    """Turns documents into rows (packing); comes first among row operators. Without one,
    each document becomes a row of its own."""
    holes: ClassVar[tuple[str, ...]] = ()
    """Fields a framework may own, None (open) in a recipe until
    :meth:`zephon.recipe.DataRecipe.resolve` fills them; a pipeline refuses an open one."""

    def check_filled(self) -> None:
        """Raise a ConfigError naming the first field of :attr:`holes` still open."""
        for name in self.holes:
            if getattr(self, name) is None:
                raise ConfigError(f"{self.op_name}: {name} is open (a recipe leaves it to the "
                                  "framework); give one")

    @abstractmethod
    def build(self, context: BuildContext) -> Operator:
        """The operator for one loader (a tokenizer loaded once, shared by the lanes)."""

    def fields(self) -> dict[str, Any]:
        """The spec's options as a dict (what the default fingerprint holds)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore
                if f.metadata.get("fingerprint", True)}


@dataclass(frozen=True)
class DocumentSpec(OperatorSpec):
    """Base of the per-document operators' specs: they may apply to some datasets only, and
    may repeat (a tokenizing operator once per dataset, see :func:`check_order`)."""

    stage: ClassVar[str] = "document"
    once: ClassVar[bool] = False

    datasets: tuple[str, ...] | None = dataclasses.field(default=None, kw_only=True)
    """Apply to these datasets only (None: to all). Lets differently shaped sources share a
    pipeline: ``tokenize(field="body", datasets=("web",))`` beside
    ``tokenize(field="content", datasets=("wiki",))``."""

    def __post_init__(self) -> None:
        if isinstance(self.datasets, (list, str)):
            names = [self.datasets] if isinstance(self.datasets, str) else self.datasets
            object.__setattr__(self, "datasets", tuple(names))
        if self.datasets is not None and (not self.datasets or not all(
                isinstance(n, str) and n for n in self.datasets)):
            raise ConfigError(f"{self.op_name}: datasets must name datasets, got "
                              f"{self.datasets!r}")


def applies_to(spec: OperatorSpec, dataset: str) -> bool:
    """Whether the per-document operator ``spec`` runs on ``dataset``."""
    names = getattr(spec, "datasets", None)
    return names is None or dataset in names


def _overlap(a: OperatorSpec, b: OperatorSpec) -> bool:
    first, second = getattr(a, "datasets", None), getattr(b, "datasets", None)
    return first is None or second is None or bool(set(first) & set(second))


class Operator(ABC):  # noqa: B024 - the abstract methods are its subclasses'
    """An operator built for one loader, shared by all its lanes; its subclasses'
    abstract methods are enforced (a subclass without them cannot be instantiated)."""

    def __init__(self, spec: OperatorSpec):
        self.spec = spec

    def fingerprint(self) -> dict[str, Any]:
        """Everything a resume must find unchanged; ``op`` names the operator."""
        return {"op": self.spec.op_name, **self.spec.fields()}


class DocumentOperator(Operator):
    """A pure per-document transformation; see the module docstring."""

    columns: list[str] | None = None
    """Columns this operator reads from ``Doc.fields`` (None: all). Used to project reads."""
    batch_size: int | None = None
    """Documents it prefers per ``apply`` call (None: no preference); affects speed only."""
    releases_gil: bool = False
    """Whether ``apply`` spends much of its time in native code with the GIL released (the
    Rust tokenizer's batch calls). With ``workers=0``, a dataset's read-ahead batches go to the
    rank's document threads only when one of its operators does, and the threads overlap that
    work with the rest of the pipeline; otherwise they run on the producer thread that reads
    the dataset, where more threads could only take turns at the GIL with it
    (``benchmarks/operator_threads.py`` measures both choices)."""

    @property
    def id_limit(self) -> int | None:
        """Every token id this operator makes is below this (None: it makes no ids). A
        loader state holding an id at or above the largest limit of its pipeline's operators
        is refused."""
        return None

    @abstractmethod
    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        """One outcome per document; ``where`` names each document's row for messages."""


class Node(ABC):
    """One lane's runtime side of a row operator: pulls from ``upstream``, which ends with
    ``None``. Snapshots are plain data; a ``"stats"`` entry, if present, is summed into the
    pipeline report (see :mod:`zephon.report`)."""

    @abstractmethod
    def next(self) -> Any | None:
        """The next item, or None once the upstream has ended and everything was emitted."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """This node's state as plain data; later work never changes a taken snapshot."""

    @abstractmethod
    def restore(self, state: dict[str, Any]) -> None:
        """Continue exactly after the snapshot ``state``. The state may come from a damaged
        checkpoint: refuse what this node could not have written with a
        :class:`zephon.field_checks.StateFieldError` naming the field (the helpers of
        :mod:`zephon.field_checks` check one field each)."""


class BufferedNode(Node):
    """A node over an algorithm that takes one upstream item at a time and emits any number
    of records (``push``), and emits what it still holds when the upstream ends (``flush``).
    Its snapshot holds the records made but not yet pulled, whether the upstream ended, and
    the algorithm's own state (``algorithm_snapshot``). A node that is only a buffer over an
    ``algorithm`` with ``add(item) -> records`` and ``flush() -> records`` (pack, shuffle)
    passes it here, and ``push`` and ``flush`` hand items to it."""

    def __init__(self, upstream: Node, algorithm: Any = None):
        self.upstream = upstream
        self.algorithm = algorithm
        self._out: deque[Record] = deque()
        self._ended = False

    def push(self, item: Any) -> list[Record]:
        return self.algorithm.add(item)

    def flush(self) -> list[Record]:
        return self.algorithm.flush()

    @abstractmethod
    def algorithm_snapshot(self) -> dict[str, Any]: ...

    @abstractmethod
    def algorithm_restore(self, state: dict[str, Any]) -> None:
        """Restore the algorithm from ``state`` (the whole snapshot; ``out`` and ``ended``
        are checked already)."""

    def check_output(self, record: Record, path: str) -> None:
        """Refuse a record of a snapshot (held at ``path``) that this node could not have
        handed on. By default: what the upstream node could not have handed on, where that
        is a buffered node too (a shuffle hands on its upstream's rows unchanged)."""
        if isinstance(self.upstream, BufferedNode):
            self.upstream.check_output(record, path)

    def next(self) -> Record | None:
        while not self._out:
            if self._ended:
                return None
            item = self.upstream.next()
            if item is None:
                self._ended = True
                self._out.extend(self.flush())
            else:
                self._out.extend(self.push(item))
        return self._out.popleft()

    def snapshot(self) -> dict[str, Any]:
        return {**self.algorithm_snapshot(), "out": [r.to_plain() for r in self._out],
                "ended": self._ended}

    def restore(self, state: dict[str, Any]) -> None:
        state = need_dict(state, "")
        for name in ("out", "ended"):
            if name not in state:
                raise StateFieldError(name, "is missing")
        ended = need_bool(state["ended"], "ended")
        out = [record_from_state(r, item("out", i))
               for i, r in enumerate(need_list(state["out"], "out"))]
        for i, record in enumerate(out):
            self.check_output(record, item("out", i))
        self.algorithm_restore(state)
        self._out = deque(out)
        self._ended = ended


class RowOperator(Operator):
    """An operator that runs after the mixer as one :class:`Node` per lane."""

    @abstractmethod
    def node(self, upstream: Node, lane: int) -> Node:
        """A fresh node for ``lane`` reading from ``upstream``."""


def check_order(specs: Sequence[OperatorSpec], new: OperatorSpec) -> None:
    """Refuse ``new`` after ``specs`` when it breaks a declared order rule."""
    name = new.op_name
    if new.stage not in STAGES:
        raise ConfigError(f"{name}: stage {new.stage!r} is not one of {STAGES}")
    if new.needs_tokens and not any(spec.makes_tokens for spec in specs):
        raise ConfigError(f"{name} works on token ids: pipelines need tokenize(...) or "
                          f"tokenize_chat(...) before {name}")
    for spec in specs:
        if new.once and type(spec) is type(new) and spec.op_name == name:
            raise ConfigError(f"{name} is already in this pipeline")
        if spec.stage == "batch":
            raise ConfigError(f"{name} cannot come after {spec.op_name}: batch is the last "
                              "operator")
        if STAGES.index(spec.stage) > STAGES.index(new.stage):
            raise ConfigError(f"{name} must come before {spec.op_name} ({new.stage} "
                              f"operators come before {spec.stage} operators)")
        if new.makes_tokens and spec.makes_tokens and _overlap(new, spec):
            raise ConfigError(f"{name}: {spec.op_name} already tokenizes these datasets "
                              "(give each tokenizing operator its own datasets=...)")
        if new.makes_rows and spec.makes_rows:
            raise ConfigError(f"{name}: {spec.op_name} already packs this pipeline")
        if new.makes_rows and spec.stage == "row":
            raise ConfigError(f"{name} must come before {spec.op_name} (rows are made before "
                              "they are reordered)")


def check_chain(specs: Sequence[OperatorSpec], datasets: Sequence[str] = ()) -> None:
    """Rules that only a complete chain can check (run when a loader is built): batch last,
    operators name only known datasets, and with any tokenizing operator every dataset is
    tokenized by exactly one."""
    if not specs or specs[-1].stage != "batch":
        raise ConfigError("the pipeline needs a batch(...) operator to be iterated")
    if not datasets:
        return
    for spec in specs:
        unknown = sorted(set(getattr(spec, "datasets", None) or ()) - set(datasets))
        if unknown:
            raise ConfigError(f"{spec.op_name}: datasets={unknown} are not in the work "
                              f"source (datasets: {list(datasets)})")
    tokenizers = [s for s in specs if s.makes_tokens]
    if tokenizers:
        missing = [d for d in datasets if not any(applies_to(s, d) for s in tokenizers)]
        if missing:
            raise ConfigError(f"datasets {missing} are not tokenized: every dataset needs one "
                              "tokenize/tokenize_chat/pretokenized operator (datasets=...)")
