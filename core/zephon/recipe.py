"""Data recipes: one TOML schema for the core, the TorchTitan adapter and the Megatron adapter.

A recipe fixes the data (datasets, weights, seed, lanes), how it is tokenized, packed, shuffled
and batched, and the ``to_training`` choices (the masking recipe). Frameworks supply what they
own: the context length (rows are packed to ``seq_len + 1``), the microbatch size and the
data-parallel rank and size. Example::

    seed = 42
    lanes = 8

    [[datasets]]
    name = "web"
    path = "data/web/*.parquet"     # relative to this file; or hf://...; or demo:corpus
    weight = 0.7

    [[datasets]]
    name = "wiki"
    path = "data/wiki"
    weight = 0.3

    [mixture]
    by = "tokens"                   # or "documents" (the default without estimation keys)
    repeat = ["wiki"]               # datasets that start a new epoch when they run out
    on_exhausted = "stop"           # or "drain"

    [[ops]]                         # per-document operators, in order, before tokenize
    op = "filter"                   # map, filter, or a registered operator / "pkg.mod:Spec"
    fn = "my_project.quality:keep"

    [tokenize]
    tokenizer = "demo:tokenizer"    # a directory (relative to this file), a Hub id, or demo:
    field = "text"

    [pack]
    algorithm = "wrap"              # max_length defaults to the framework's seq_len + 1

    [shuffle]
    buffer_size = 64

    [to_training]
    return_labels = true
    eos_mask_loss = true            # eos_token_id defaults to the tokenizer's EOS

Every key is checked: an unknown one, or a value of the wrong type, is an error naming the file,
the section and the key. The keys are not listed here but derived from the classes that own
them (:func:`recipe_schema`): the operator specs (``[tokenize]``, ``[pack]``, ``[shuffle]``,
``[batch]``, ``[[ops]]``), ``TokenEstimation`` and the work source's options (``[mixture]``,
``[work]``), ``CacheOptions`` (``[cache]``), ``TrainingOptions`` (``[to_training]``) and
``LoaderOptions`` (top-level ``lanes``, ``prefetch``, ``read_ahead_tokens``, ``workers``), so a
new field is a new key.

Mixing is by tokens when ``[mixture] by = "tokens"`` or any token-estimation key (``primer``,
``calibration_samples``, ``calibration_shards_max``) is given, by documents otherwise: the
same rule as the Python API, where passing ``token_estimation`` mixes by tokens.

``[[ops]]`` entries run before tokenization unless they set ``after_tokenize = true`` (then
they see ``input_ids``).
``demo:corpus`` and ``demo:tokenizer`` name the embedded demo corpus and tokenizer;
``demo:chat`` and ``demo:chat-tokenizer`` a synthetic chat corpus and a tokenizer with a
ChatML-style template, for SFT recipes (``[tokenize] kind = "chat"``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, DataError
from zephon.io.storage import is_remote
from zephon.io.store_options import CacheOptions
from zephon.loader_options import LoaderOptions
from zephon.ops.base import OperatorSpec, check_order
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackFlatSpec, PackSequencesSpec, PackSpec
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.ops.registry import operator_spec_class
from zephon.ops.shuffle import ShuffleSpec
from zephon.ops.tokenize import TokenizeSpec
from zephon.ops.tokenize_chat import TokenizeChatSpec
from zephon.schema import Key, dataclass_keys, parameter_keys, read_table_parts
from zephon.tokenizer import looks_local
from zephon.training import TrainingOptions
from zephon.work.estimation import TokenEstimation
from zephon.work.static_mixture import StaticMixtureWorkSource

_MIX_SOURCE_KEYS = ("repeat", "on_exhausted")
_WORK_SOURCE_KEYS = ("shuffle_units", "shuffle_rows", "unit_bytes", "arrow_unit_rows")
_ESTIMATION_KEYS = tuple(f.name for f in dataclasses.fields(TokenEstimation))
_TOKENIZERS = {"text": TokenizeSpec, "chat": TokenizeChatSpec, "pretokenized": PretokenizedSpec}


@dataclass
class DatasetEntry:
    name: str
    """Dataset name, used by the mixture and in every report."""
    path: str
    """Local file/dir/glob (relative to the recipe), ``hf://`` path, object-store path
    (``s3://bucket/prefix/*.parquet``; credentials and endpoint from the environment or the
    AWS profile files), or ``demo:corpus``."""
    weight: float = 1.0
    """Target share before normalization."""
    fmt: str | None = None
    """Force a file format (parquet, jsonl, arrow, megatron, mds, or a registered one)."""
    documents: list[int] | None = None
    """``[start, stop)``: read only these documents of a Megatron indexed dataset."""
    field: str | None = None
    """The column holding this dataset's documents, when it is not ``[tokenize] field``."""
    kind: str | None = None
    """``text``, ``chat`` or ``pretokenized`` for this dataset, when it is not ``[tokenize]
    kind``; it shares ``[tokenize]`` tokenizer and max_document_tokens."""
    add_bos: bool = False
    """A ``kind = "pretokenized"`` dataset in a recipe with a tokenizer: put the tokenizer's
    BOS before each of its documents, as text documents get it."""
    add_eos: bool = False
    """A ``kind = "pretokenized"`` dataset in a recipe with a tokenizer: put the tokenizer's
    EOS after each of its documents, as text documents get it (token ids written without a
    separator would otherwise run together; data that ends in EOD already needs none). Its
    ids are checked against the tokenizer's vocabulary either way."""


@dataclass(frozen=True)
class _TopLevel:
    seed: int = 0
    """Seed of the unit and row orders (and of shuffles)."""
    plan: str = ""
    """A plan written by ``zephon plan`` (relative to this file): every rank takes the
    datasets' listings and units from it instead of listing and opening the files
    (:mod:`zephon.work.plan_file`)."""


@dataclass(frozen=True)
class _MixtureChoice:
    by: str | None = None
    """``"tokens"`` or ``"documents"``. Default: tokens when a token-estimation key is given,
    documents otherwise."""
    stages: list[dict[str, Any]] | None = None
    """Shares that change as training goes on (``[[mixture.stages]]``): each stage has
    ``weights`` (a table of dataset names), ``until_tokens`` (tokens handed to the trainer by
    the whole job when it ends; the last stage runs to the end) and optionally
    ``ramp_tokens`` (move linearly from the previous stage's shares over that many tokens).
    The datasets' own ``weight`` keys are then not used. Mixing is by tokens. A resume may
    change the stages the run has not reached (:mod:`zephon.work.schedule`)."""


@dataclass(frozen=True)
class _TokenizeChoice:
    kind: str = "text"
    """``"text"`` (tokenize), ``"chat"`` (tokenize_chat) or ``"pretokenized"`` (token ids
    already, e.g. Megatron indexed datasets)."""
    tokenizer: str = ""
    """A tokenizer directory (relative to the recipe), a Hub id, ``demo:tokenizer`` or
    ``demo:chat-tokenizer``."""


@dataclass(frozen=True)
class _OpsEntry:
    op: str = ""
    """``map``, ``filter``, a registered operator's name, or ``"package.module:SpecClass"``."""
    after_tokenize: bool = False
    """Run after tokenization (the operator sees ``input_ids``) instead of before."""


@functools.cache
def recipe_schema() -> dict[str, dict[str, Key]]:
    """Every section's keys: ``""`` is the top level, ``tokenize.chat`` the chat variant and
    ``ops`` the keys every ``[[ops]]`` entry has besides its operator's own."""
    cache = {k: v for k, v in dataclass_keys(CacheOptions).items() if k != "enabled"}
    return {
        "": {**dataclass_keys(_TopLevel), **dataclass_keys(LoaderOptions)},
        "datasets": dataclass_keys(DatasetEntry),
        "mixture": {**dataclass_keys(_MixtureChoice), **dataclass_keys(TokenEstimation),
                    **parameter_keys(StaticMixtureWorkSource, _MIX_SOURCE_KEYS)},
        "tokenize": {**dataclass_keys(_TokenizeChoice),
                     **dataclass_keys(TokenizeSpec, exclude=("tokenizer_id",))},
        "tokenize.chat": {**dataclass_keys(_TokenizeChoice),
                          **dataclass_keys(TokenizeChatSpec, exclude=("tokenizer_id",))},
        "tokenize.pretokenized": {"kind": dataclass_keys(_TokenizeChoice)["kind"],
                                  **dataclass_keys(PretokenizedSpec)},
        "ops": dataclass_keys(_OpsEntry),
        "pack": dataclass_keys(PackSpec),
        "shuffle": dataclass_keys(ShuffleSpec),
        "batch": dataclass_keys(BatchSpec),
        "to_training": dataclass_keys(TrainingOptions),
        "cache": cache,
        "work": parameter_keys(StaticMixtureWorkSource, _WORK_SOURCE_KEYS),
    }


_SECTIONS = ("datasets", "mixture", "tokenize", "ops", "pack", "shuffle", "batch",
             "to_training", "cache", "work")


@dataclass(frozen=True)
class TrainingPreset:
    """The ``[to_training]`` values a framework adapter fixes. A recipe may leave them out
    (they count as given where options are checked together: ``eos_mask_loss`` needs
    ``return_labels``), and a recipe value that contradicts one is an error naming it."""

    framework: str
    """The framework's name, for messages."""
    fixed: dict[str, Any]
    """``{to_training key: the value the adapter passes}``."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """``{to_training key: the adapter's choice where the recipe leaves the key out}``."""

    def applied(self, to_training: dict[str, Any]) -> dict[str, Any]:
        """A recipe's ``[to_training]`` as the adapter completes it: its defaults, then the
        recipe's keys, then the fixed values."""
        return {**self.defaults, **to_training, **self.fixed}


@dataclass(frozen=True)
class DataRecipe:
    """A validated data recipe; build a Pipeline with :meth:`build`. The operator sections are
    the operator specs themselves (``[[ops]]``, ``[pack]``, ``[shuffle]``, ``[batch]``) and
    ``[cache]`` is a ``CacheOptions``, each checked when read. The values a framework owns are
    holes: ``pack.max_length`` and ``batch.microbatch_size`` are None where the recipe leaves
    them to the framework, and the lanes where it leaves them open; :meth:`resolve` fills
    them. ``[mixture]``, ``[work]``, ``[tokenize]`` and ``[to_training]`` are option tables
    (checked against :func:`recipe_schema` and by the classes they are passed to).

    A recipe is not changed once read (``dataclasses.replace`` makes a variant). Each dataset
    is listed once (its files, sizes and versions) and the listing is shared by the
    recipe's variants: validating, checking and building a recipe lists the data once."""

    datasets: list[DatasetEntry]
    seed: int = 0
    lanes: int | None = None
    """Lanes of the run; None lets it default to the data-parallel size (with a warning)."""
    prefetch: int | None = None
    read_ahead_tokens: int | None = None
    """Read-ahead budget (``LoaderOptions.read_ahead_tokens``); None: its default."""
    workers: int | None = None
    """Processes for the document operators (``LoaderOptions.workers``); None: 0."""
    mixture: dict[str, Any] = field(default_factory=dict)
    tokenize: dict[str, Any] = field(default_factory=dict)
    ops: tuple[OperatorSpec, ...] = ()
    """``[[ops]]`` that run before tokenizing, in order."""
    ops_after_tokenize: tuple[OperatorSpec, ...] = ()
    """``[[ops]]`` with ``after_tokenize = true``, in order."""
    pack: PackSpec | None = field(default_factory=lambda: PackFlatSpec(max_length=None))
    """Packing; ``max_length`` None: the framework's ``seq_len + 1``. None: no packing."""
    shuffle: ShuffleSpec | None = None
    batch: BatchSpec = field(default_factory=lambda: BatchSpec(microbatch_size=None))
    """Batching; ``microbatch_size`` None: the framework's."""
    to_training: dict[str, Any] = field(default_factory=dict)
    cache: CacheOptions | None = None
    work: dict[str, Any] = field(default_factory=dict)
    plan: str | None = None
    """A saved plan's path (``zephon plan``); None: the ranks plan (once per job)."""
    source: str = "<dict>"
    """Where the recipe came from, for error messages."""
    preset: TrainingPreset | None = None
    """The ``[to_training]`` values the framework that runs this recipe fixes."""
    listed: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False,
                                                compare=False)
    """Datasets already listed, by entry (see :meth:`dataset`); shared with variants."""

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | os.PathLike[str],
                  preset: TrainingPreset | None = None) -> DataRecipe:
        path = Path(path)
        return cls.from_dict(read_toml(path), source=str(path), base_dir=path.parent,
                             preset=preset)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>",
                  base_dir: str | os.PathLike[str] | None = None,
                  datasets: list[DatasetEntry] | None = None,
                  preset: TrainingPreset | None = None) -> DataRecipe:
        """A recipe from TOML-shaped ``data``. ``datasets`` supplies the datasets from
        elsewhere (a framework's own data flags); the recipe must then name none.
        ``preset``: the framework's fixed ``[to_training]`` values (see
        :class:`TrainingPreset`)."""
        schema = recipe_schema()
        found = _Collector()
        top = found.read({k: v for k, v in data.items() if k not in _SECTIONS}, schema[""],
                         source, None)
        sections = {}
        for name in ("mixture", "pack", "shuffle", "batch", "to_training", "cache", "work"):
            if data.get(name) is not None:
                sections[name] = found.read(data[name], schema[name], source, name)
        raw_sets = data.get("datasets") or []
        if datasets is not None and raw_sets:
            found.add(f"{source}: [[datasets]] conflicts with the datasets given by the "
                      "framework's data flags; remove one of them")
        if datasets is None and (not isinstance(raw_sets, list) or not raw_sets):
            found.add(f"{source}: the recipe names no [[datasets]]")
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        entries = [e for e in (found.attempt(lambda raw=raw: _dataset_entry(raw, source, base,
                                                                            found))
                               for raw in (raw_sets if isinstance(raw_sets, list) else []))
                   if e is not None]
        if len(entries) < (len(raw_sets) if isinstance(raw_sets, list) else 0):
            found.flawed.add("datasets")
        entries += datasets or []
        tokenize = found.attempt(lambda: _read_tokenize(data.get("tokenize") or {}, source,
                                                        found))
        if tokenize is None:
            found.flawed.add("tokenize")
            tokenize = {}
        if "tokenizer" in tokenize:
            tokenize["tokenizer"] = _resolve_tokenizer(tokenize["tokenizer"], base)
        ops: tuple[list[OperatorSpec], list[OperatorSpec]] = ([], [])
        for entry in found.attempt(lambda: _as_list(data.get("ops"), source), []):
            options = found.attempt(lambda entry=entry: found.read(
                entry, {**schema["ops"], **_op_keys(entry, source)}, source, "ops"))
            spec = None if options is None else found.attempt(
                lambda options=options: _op_spec(options), prefix=f"{source}: [[ops]] ")
            if spec is None:
                found.flawed.add("ops")
            else:
                ops[bool(options.get("after_tokenize", False))].append(spec)
        cache = sections.get("cache")
        if cache and "root" in cache:
            cache["root"] = str(base / os.path.expanduser(cache["root"]))
        typed = {
            "pack": (lambda: _pack_spec(sections.get("pack", {}))) if "pack" in data
            else (lambda: PackFlatSpec(max_length=None)),
            "shuffle": lambda: ShuffleSpec(**sections["shuffle"])
            if sections.get("shuffle") else None,
            "batch": lambda: BatchSpec(**{"microbatch_size": None, **sections.get("batch", {})}),
            "cache": lambda: CacheOptions(enabled=True, **cache) if cache else None,
        }
        specs: dict[str, Any] = {"pack": PackFlatSpec(max_length=None), "shuffle": None,
                                 "batch": BatchSpec(microbatch_size=None), "cache": None}
        for name, make in typed.items():
            if name in found.flawed:
                continue  # its problems are listed already
            before = len(found.problems)
            made = found.attempt(make, prefix=f"{source}: [{name}] ")
            if len(found.problems) > before:
                found.flawed.add(name)
            else:
                specs[name] = made
        recipe = cls(
            datasets=entries,
            seed=top.get("seed", 0),
            lanes=top.get("lanes"),
            prefetch=top.get("prefetch"),
            read_ahead_tokens=top.get("read_ahead_tokens"),
            workers=top.get("workers"),
            plan=str(base / os.path.expanduser(top["plan"])) if top.get("plan") else None,
            mixture=sections.get("mixture", {}),
            tokenize=tokenize,
            ops=tuple(ops[0]),
            ops_after_tokenize=tuple(ops[1]),
            pack=specs["pack"],
            shuffle=specs["shuffle"],
            batch=specs["batch"],
            to_training=sections.get("to_training", {}),
            cache=specs["cache"],
            work=sections.get("work", {}),
            source=source,
            preset=preset,
        )
        found.problems += recipe._problems(found.flawed)
        found.raise_if_any(source)
        return recipe

    @property
    def mix_by(self) -> str:
        """``"tokens"`` or ``"documents"``; see the module docstring for the default."""
        by = self.mixture.get("by")
        if by is None:
            by = "tokens" if self.mixture.get("stages") or any(
                k in self.mixture for k in _ESTIMATION_KEYS) else "documents"
        return by

    @property
    def tokenizer(self) -> str | None:
        """The tokenizer as resolved (a directory path or a Hub id); None for pretokenized
        data."""
        return self.tokenize.get("tokenizer")

    def validate(self) -> None:
        """Cheap checks that fail before training starts: files, tokenizer, option values.
        Raises :class:`RecipeProblems` listing every problem found."""
        problems = self._problems()
        if problems:
            raise RecipeProblems(self.source, problems)

    def _problems(self, flawed: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """Every problem of the values read; checks that need a section named in ``flawed``
        (one that had problems of its own when read) are left out rather than guessed at."""
        found = _Collector()
        names = [e.name for e in self.datasets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            found.add(f"{self.source}: [[datasets]] names must be unique; repeated: {repeated}")
        found.attempt(lambda: self._checked("", lambda: LoaderOptions(**{
            k: v for k, v in (("lanes", self.lanes), ("prefetch", self.prefetch),
                              ("read_ahead_tokens", self.read_ahead_tokens),
                              ("workers", self.workers)) if v is not None})))
        for entry in self.datasets:
            if not is_remote(entry.path):
                found.attempt(lambda entry=entry: self.dataset(entry).files(),
                              prefix=f"{self.source}: dataset {entry.name!r}: ")
        tokenizer = self.tokenize.get("tokenizer")
        kinds = {e.kind or self.tokenize.get("kind", "text") for e in self.datasets}
        if tokenizer is None and kinds - {"pretokenized"} and "tokenize" not in flawed:
            found.add(f"{self.source}: [tokenize] needs tokenizer = <dir or Hub id>")
        if tokenizer is not None and looks_local(tokenizer) and not Path(tokenizer).is_dir():
            found.add(f"{self.source}: [tokenize] tokenizer directory {tokenizer!r} does not "
                      "exist")
        if self.mix_by not in ("tokens", "documents"):
            found.add(f"{self.source}: [mixture] by={self.mix_by!r} is not 'tokens' or "
                      "'documents'")
        if self.datasets and "datasets" not in flawed:
            found.problems += self._mixture_problems()
        tokenize = [] if flawed & {"tokenize", "datasets"} or (
            tokenizer is None and kinds - {"pretokenized"}) else found.attempt(
            lambda: self._checked("[tokenize]", self.tokenize_specs), [])
        chain = [*self.ops, *tokenize, *self.ops_after_tokenize]
        chain += [spec for spec in (self.pack, self.shuffle, self.batch) if spec is not None]
        if tokenize:
            for i, spec in enumerate(chain):
                before_count = len(found.problems)
                found.attempt(lambda i=i, spec=spec: self._checked(
                    "operators:", lambda: check_order(chain[:i], spec)))
                if len(found.problems) > before_count:
                    break  # later operators would only repeat the same complaint
        fixed = dict(self.preset.fixed) if self.preset else {}
        for key, value in self.to_training.items():
            if key in fixed and value != fixed[key]:
                found.add(f"{self.source}: [to_training] {key} = {value!r} conflicts with "
                          f"{self.preset.framework}, which needs {fixed[key]!r}; remove it "
                          "(the adapter sets it)")
                flawed = {*flawed, "to_training"}
        options = {k: v for k, v in {**fixed, **self.to_training}.items()
                   if k != "eos_token_id"}
        if options.get("eos_mask_loss"):
            options["eos_token_id"] = self.to_training.get("eos_token_id", 0)
        if "to_training" not in flawed:
            found.attempt(lambda: self._checked("[to_training]", lambda: TrainingOptions(**{
                **options, "rename_fields": dict(options.get("rename_fields", {})),
                "exclude_fields": tuple(options.get("exclude_fields", ()))})))
        return found.problems

    def dataset(self, entry: DatasetEntry) -> Any:
        """The :class:`~zephon.io.Dataset` of ``entry``, one per entry for this recipe and its
        variants, so its files are listed once."""
        from zephon.io.dataset import Dataset

        key = (entry.name, entry.path, entry.fmt, tuple(entry.documents or ()))
        if key not in self.listed:
            dataset = Dataset.from_path(entry.name, entry.path, entry.fmt, **_documents(entry))
            if self.plan is not None:
                self.saved_plan().adopt(dataset)
            self.listed[key] = dataset
        return self.listed[key]

    def saved_plan(self) -> Any:
        """The plan file the recipe names (read once), or None."""
        if self.plan is None:
            return None
        key = ("plan", self.plan)
        if key not in self.listed:
            from zephon.work.plan_file import read_plan

            self.listed[key] = read_plan(self.plan)
        return self.listed[key]

    def _stage_problems(self, names: list[str]) -> list[str]:
        """``[[mixture.stages]]`` checked: the stages themselves, mixing by tokens, every
        name a dataset of the recipe, no dataset weight that the stages would override."""
        stages = self.mixture.get("stages")
        if not stages:
            return []
        from zephon.work import MixtureSchedule

        where = f"{self.source}: [[mixture.stages]]"
        try:
            schedule = MixtureSchedule(stages)
        except ConfigError as exc:
            return [f"{where}: {exc}"]
        problems = []
        if self.mix_by != "tokens":
            problems.append(f"{where}: stages end at token counts; mix by tokens "
                            f"([mixture] by = \"tokens\", not {self.mix_by!r})")
        unknown = sorted(set(schedule.names) - set(names))
        if unknown:
            problems.append(f"{where}: names datasets the recipe does not have: {unknown} "
                            f"(datasets: {names})")
        weighted = [e.name for e in self.datasets if e.weight != 1.0]
        if weighted:
            problems.append(f"{where}: the stages give the weights; [[datasets]] weight is "
                            f"not used with them (given for {weighted})")
        return problems

    def _mixture_problems(self) -> list[str]:
        """The mixture and work-source options against the dataset names (a repeated name,
        reported by the caller, is told apart by its entry number here)."""
        from zephon.work import MixtureSpec

        names = [e.name for e in self.datasets]
        problems = []
        try:
            self._work_source([])  # the token-estimation keys
            MixtureSpec({f"{e.name} (entry {i + 1})" if names.count(e.name) > 1 else e.name:
                         e.weight for i, e in enumerate(self.datasets)})
        except ConfigError as exc:
            problems.append(f"{self.source}: [mixture] {exc}")
        problems += self._stage_problems(names)
        options = {k: self.mixture[k] for k in _MIX_SOURCE_KEYS if k in self.mixture}
        work = {k: v for k, v in self.work.items() if k in ("unit_bytes", "arrow_unit_rows")}
        sections = {"seed": "", **{k: "[work] " for k in _WORK_SOURCE_KEYS}}
        unique = list(dict.fromkeys(names))
        return problems + [
            f"{self.source}: {sections.get(p.split(' ')[0], '[mixture] ')}{p}"
            for p in StaticMixtureWorkSource.option_problems(
                unique, MixtureSpec(dict.fromkeys(unique, 1.0)), self.seed, **options, **work)]

    def _checked(self, section: str, make: Any) -> Any:
        try:
            return make()
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: {section} {exc}") from None

    # -- building --------------------------------------------------------------------------
    def _work_source(self, datasets: list[Any]) -> StaticMixtureWorkSource | None:
        estimation = None
        if self.mix_by == "tokens":
            estimation = TokenEstimation(**{k: self.mixture[k] for k in _ESTIMATION_KEYS
                                            if k in self.mixture})
        if not datasets:
            return None
        from zephon.work import MixtureSchedule, MixtureSpec, ScheduledMixtureWorkSource

        options = {k: self.mixture[k] for k in _MIX_SOURCE_KEYS if k in self.mixture}
        if self.mixture.get("stages"):
            return ScheduledMixtureWorkSource(datasets, MixtureSchedule(self.mixture["stages"]),
                                              seed=self.seed, token_estimation=estimation,
                                              **options, **self.work)
        mixture = MixtureSpec({e.name: e.weight for e in self.datasets})
        return StaticMixtureWorkSource(datasets, mixture, seed=self.seed,
                                       token_estimation=estimation, **options, **self.work)

    def tokenize_specs(self) -> list[OperatorSpec]:
        """One tokenizing operator, or one per group of datasets that name their own field or
        kind (each then limited to its datasets)."""
        options = dict(self.tokenize)
        kind = options.pop("kind", "text")
        groups: dict[tuple[str, str | None, bool, bool], list[str]] = {}
        for entry in self.datasets:
            key = (entry.kind or kind, entry.field, entry.add_bos, entry.add_eos)
            groups.setdefault(key, []).append(entry.name)
        if list(groups) == [(kind, None, False, False)]:
            return [_tokenizer_spec(kind, options)]
        shared = {k: v for k, v in options.items() if k in ("tokenizer", "max_document_tokens")}
        specs = []
        for (own_kind, field_name, add_bos, add_eos), names in groups.items():
            own = dict(options if own_kind == kind else shared)
            if field_name is not None:
                own["field"] = field_name
            if own_kind == "pretokenized" and kind != "pretokenized":
                own.update(self._tokenizer_ids(names, add_bos, add_eos))
            specs.append(_tokenizer_spec(own_kind, own, tuple(names)))
        return specs

    def resolve(self, values: FrameworkValues | None = None) -> ResolvedRecipe:
        """This recipe with the holes a framework owns filled from ``values``: the row
        length (``seq_len + 1``), the microbatch rows and the lanes. A value the recipe fixes
        must agree with the framework's; every disagreement is listed in one
        :class:`RecipeProblems`. The datasets are listed here, once for the recipe and its
        variants; a hole neither side fills stays open and only :meth:`ResolvedRecipe.build`
        needs it."""
        values = values or FrameworkValues()
        problems: list[str] = []
        pack = self.pack
        if pack is not None and values.seq_len is not None:
            if pack.max_length not in (None, values.seq_len + 1):
                problems.append(
                    f"{self.source}: [pack] max_length = {pack.max_length} conflicts with the "
                    f"framework's sequence length {values.seq_len}{values.named('seq_len')} "
                    f"(rows are seq_len + 1 = {values.seq_len + 1} tokens); remove it or make "
                    "them agree")
            pack = dataclasses.replace(pack, max_length=values.seq_len + 1)
        batch = self.batch
        if values.microbatch_size is not None:
            if batch.microbatch_size not in (None, values.microbatch_size):
                problems.append(
                    f"{self.source}: [batch] microbatch_size = {batch.microbatch_size} "
                    f"conflicts with the framework's {values.microbatch_size}"
                    f"{values.named('microbatch_size')}; remove it from the recipe or make "
                    "them agree")
            batch = dataclasses.replace(batch, microbatch_size=values.microbatch_size)
        lanes = self.lanes if self.lanes is not None else values.lanes
        if self.lanes is not None and values.lanes not in (None, self.lanes):
            problems.append(f"{self.source}: lanes = {self.lanes} conflicts with the "
                            f"framework's {values.lanes}{values.named('lanes')}; remove it "
                            "from the recipe or make them agree")
        if problems:
            raise RecipeProblems(self.source, problems)
        specs = (*self.ops, *self.tokenize_specs(), *self.ops_after_tokenize,
                 *(spec for spec in (pack, self.shuffle, batch) if spec is not None))
        max_length = pack.max_length if pack is not None else None
        rows = batch.microbatch_size
        return ResolvedRecipe(self, values, tuple(self.dataset(e) for e in self.datasets),
                              specs, lanes=lanes, max_length=max_length, microbatch_size=rows)

    def build(self, *, seq_len: int | None = None, microbatch_size: int | None = None,
              dp_rank: int = 0, dp_world_size: int = 1, lanes: int | None = None,
              process_group: Any = None, prefetch: int | None = None,
              workers: int | None = None) -> Any:
        """A Pipeline for this rank: :meth:`resolve` with the framework's values, then
        :meth:`ResolvedRecipe.build`."""
        values = FrameworkValues(seq_len=seq_len, microbatch_size=microbatch_size,
                                 dp_size=dp_world_size, lanes=lanes)
        return self.resolve(values).build(dp_rank=dp_rank, process_group=process_group,
                                          prefetch=prefetch, workers=workers)

    def _tokenizer_ids(self, names: list[str], add_bos: bool, add_eos: bool
                       ) -> dict[str, int]:
        """What pretokenized datasets ``names`` take from the recipe's tokenizer: its
        vocabulary size (their ids are checked against it) and the BOS and EOS ids they
        ask for."""
        from zephon.tokenizer import resolve_encoder

        encoder = resolve_encoder(self.tokenizer, None)
        out = {"vocab_size": len(encoder.tokenizer)}
        for wanted, key, value, what in ((add_bos, "bos_token_id", encoder.special.bos, "BOS"),
                                         (add_eos, "eos_token_id", encoder.special.eos, "EOS")):
            if not wanted:
                continue
            if value is None:
                raise ConfigError(f"{self.source}: [[datasets]] {names[0]!r} asks for "
                                  f"add_{what.lower()}, but the tokenizer {self.tokenizer!r} "
                                  f"has no {what} token")
            out[key] = int(value)
        return out

    def eos_token_id(self) -> int:
        """``[to_training] eos_token_id``, else the recipe tokenizer's EOS id."""
        eos = self.to_training.get("eos_token_id")
        if eos is None and self.tokenizer is None:
            eos = self.tokenize.get("eos_token_id")
        elif eos is None:
            from zephon.tokenizer import resolve_encoder

            eos = resolve_encoder(self.tokenizer, None).special.eos
        if eos is None:
            raise ConfigError(f"{self.source}: eos_mask_loss needs eos_token_id; the tokenizer "
                              "has no EOS token")
        return int(eos)

    def training_options(self) -> dict[str, Any]:
        """Keyword arguments for ``SampleBatch.to_training``, EOS id filled from the tokenizer."""
        options = dict(self.to_training)
        if options.get("eos_mask_loss"):
            options["eos_token_id"] = self.eos_token_id()
        else:  # an EOS id given for frameworks that decide the masking themselves
            options.pop("eos_token_id", None)
        return options


@dataclass(frozen=True)
class FrameworkValues:
    """The values a framework owns. A recipe leaves them open (holes that
    :meth:`DataRecipe.resolve` fills) or fixes them, and then must agree."""

    seq_len: int | None = None
    """Tokens of input per row; rows are packed to ``seq_len + 1`` (the last label)."""
    microbatch_size: int | None = None
    """Rows per microbatch."""
    dp_size: int | None = None
    """Data-parallel readers of the job; they must divide the lanes."""
    lanes: int | None = None
    """The adapter's lanes where the recipe leaves them open: its own option, those of the
    checkpoint it resumes, or its default (:func:`zephon.integration.choose_lanes`)."""
    vocab_size: int | None = None
    """The model's vocabulary, which must hold every id of the recipe's tokenizer."""
    flags: dict[str, str] = field(default_factory=dict, compare=False)
    """The framework's option behind each value (``{"seq_len": "--training.seq_len"}``),
    named where a recipe disagrees."""

    def named(self, value: str) -> str:
        """`` (the option)`` behind ``value``, or nothing."""
        return f" ({self.flags[value]})" if value in self.flags else ""


@dataclass(frozen=True)
class ResolvedRecipe:
    """A recipe with the framework's values filled in: its datasets (listed), the operator
    specs in order and the lanes, ready to build a rank's Pipeline. Preflight checks and
    pipelines take it; it is made by :meth:`DataRecipe.resolve` and never changed."""

    recipe: DataRecipe
    values: FrameworkValues
    datasets: tuple[Any, ...]
    """The :class:`~zephon.io.Dataset` of each ``[[datasets]]`` entry, in order."""
    operators: tuple[OperatorSpec, ...]
    """Every operator spec: ``[[ops]]``, tokenizing, packing, shuffle, batch."""
    lanes: int | None
    """None: open (the pipeline's default)."""
    max_length: int | None
    """Tokens per packed row; None: no packing, or no sequence length yet."""
    microbatch_size: int | None
    """Rows per microbatch; None: no value from either side yet."""

    @property
    def source(self) -> str:
        return self.recipe.source

    def work_source(self) -> StaticMixtureWorkSource:
        """The work source of the recipe's datasets, mixture and work options."""
        return self.recipe._work_source(list(self.datasets))

    def build(self, *, dp_rank: int = 0, process_group: Any = None,
              prefetch: int | None = None, workers: int | None = None) -> Any:
        """The Pipeline of data-parallel rank ``dp_rank`` of ``values.dp_size``; with a saved
        plan (``plan = FILE``), its lanes unless the recipe or the framework sets them (then
        they must agree)."""
        from zephon.io import StoreOptions
        from zephon.pipeline import Pipeline

        recipe = self.recipe
        if recipe.pack is not None and self.max_length is None:
            raise ConfigError(f"{self.source}: [pack] max_length is not set and the "
                              "framework gave no sequence length")
        if self.microbatch_size is None:
            raise ConfigError(f"{self.source}: [batch] microbatch_size is not set and the "
                              "framework gave none")
        source = self.work_source()
        lanes = self.lanes
        saved = recipe.saved_plan()
        if saved is not None:
            saved.check(lanes, (source.hints.unit_bytes, source.hints.arrow_unit_rows))
            lanes = saved.lanes
        pipeline = Pipeline(source).options(
            io_options=StoreOptions(cache=recipe.cache) if recipe.cache is not None else None,
            lanes=lanes, dp_rank=dp_rank, dp_world_size=self.values.dp_size or 1,
            prefetch=prefetch if prefetch is not None else recipe.prefetch,
            read_ahead_tokens=recipe.read_ahead_tokens,
            workers=workers if workers is not None else recipe.workers,
            process_group=process_group)
        for spec in self.operators:
            pipeline = pipeline.apply(spec)
        return pipeline


class RecipeProblems(ConfigError):
    """Every problem found in a recipe; ``problems`` holds one message each (each naming the
    recipe file and key, or the data file)."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = list(problems)
        text = problems[0] if len(problems) == 1 else (
            f"{source}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))
        super().__init__(text)


class _Collector:
    """Runs checks, keeping every problem instead of stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.flawed = set()

    def read(self, table: Any, keys: dict[str, Key], source: str, section: str | None
             ) -> dict[str, Any]:
        """The good keys of ``table`` (see :func:`read_table_parts`), its problems kept."""
        values, problems = read_table_parts(table, keys, source, section)
        if problems:
            self.problems += problems
            self.flawed.add(section or "")
        return values

    flawed: set[str]
    """Sections that had problems of their own when read."""

    def add(self, message: str) -> None:
        self.problems.append(message)

    def attempt(self, check: Any, default: Any = None, prefix: str = "") -> Any:
        try:
            return check()
        except RecipeProblems as exc:
            self.problems += exc.problems
        except (ConfigError, DataError) as exc:
            self.problems.append(f"{prefix}{exc}")
        return default

    def raise_if_any(self, source: str) -> None:
        if self.problems:
            raise RecipeProblems(source, self.problems)


def _dataset_entry(raw: Any, source: str, base: Path, found: _Collector) -> DatasetEntry:
    given = raw
    raw, problems = read_table_parts(raw, recipe_schema()["datasets"], source, "datasets")
    found.problems += problems
    if "name" not in raw or "path" not in raw:
        if problems and isinstance(given, dict) and "name" in given and "path" in given:
            raise RecipeProblems(source, [])  # the wrong type is reported already
        raise ConfigError(f"{source}: every [[datasets]] entry needs name and path, got {raw}")
    if not raw["name"].strip() or not raw["path"].strip():
        raise ConfigError(f"{source}: [[datasets]] name and path must not be empty, got {raw}")
    if raw.get("kind") is not None and raw["kind"] not in _TOKENIZERS:
        raise ConfigError(f"{source}: [[datasets]] {raw['name']!r}: kind = {raw['kind']!r} is "
                          f"not one of {sorted(_TOKENIZERS)}")
    separators = [k for k in ("add_bos", "add_eos") if raw.get(k)]
    if separators and raw.get("kind") != "pretokenized":
        raise ConfigError(f"{source}: [[datasets]] {raw['name']!r}: {separators[0]} applies to "
                          "a kind = \"pretokenized\" dataset (text documents get BOS and EOS "
                          "from [tokenize] add_bos and add_eos)")
    return DatasetEntry(raw["name"], _resolve_path(raw["path"], base),
                        float(raw.get("weight", 1.0)), raw.get("fmt"), raw.get("documents"),
                        raw.get("field"), raw.get("kind"), bool(raw.get("add_bos", False)),
                        bool(raw.get("add_eos", False)))


def _tokenizer_spec(kind: str, options: dict[str, Any],
                    datasets: tuple[str, ...] | None = None) -> OperatorSpec:
    options = dict(options)
    tokenizer = options.pop("tokenizer", None)
    if kind == "pretokenized":
        return PretokenizedSpec(**options, datasets=datasets)
    if tokenizer is None:
        raise ConfigError(f"[tokenize] needs tokenizer = <dir or Hub id> for kind={kind!r}")
    return _TOKENIZERS[kind](tokenizer_id=tokenizer, **options, datasets=datasets)


def _documents(entry: DatasetEntry) -> dict[str, Any]:
    return {"documents": tuple(entry.documents)} if entry.documents is not None else {}


def _pack_spec(table: dict[str, Any]) -> PackSpec:
    """``[pack]`` as the spec of ``pack_flat`` (``flat = true``, the default) or
    ``pack_sequences``; ``max_length`` open unless given."""
    options = {"max_length": None, **table}
    if options.pop("flat", True):
        return PackFlatSpec(**options)
    if "pad_token_id" in options:
        raise ConfigError("pack_sequences: pad_token_id does not apply (rows are not padded)")
    return PackSequencesSpec(**options)


def _op_spec(entry: dict[str, Any]) -> OperatorSpec:
    """One ``[[ops]]`` entry as its operator's spec."""
    options = {k: v for k, v in entry.items() if k not in ("op", "after_tokenize")}
    return operator_spec_class(entry["op"])(**options)


def _as_list(value: Any, source: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{source}: [[ops]] must be a list of tables")
    return value


def _op_keys(entry: Any, source: str) -> dict[str, Key]:
    if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
        raise ConfigError(f"{source}: every [[ops]] entry needs op = <operator name>, "
                          f"got {entry!r}")
    try:
        cls = operator_spec_class(entry["op"])
    except ConfigError as exc:
        raise ConfigError(f"{source}: [[ops]] {exc}") from None
    if cls.stage != "document":
        raise ConfigError(f"{source}: [[ops]] op = {entry['op']!r} is a {cls.stage} operator; "
                          "[[ops]] holds per-document operators (its own section sets the rest)")
    return dataclass_keys(cls)


def _read_tokenize(table: Any, source: str, found: _Collector) -> dict[str, Any]:
    schema = recipe_schema()
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tokenize] must be a table")
    kind = table.get("kind", "text")
    if kind not in _TOKENIZERS:
        raise ConfigError(f"{source}: [tokenize] kind={kind!r} is not one of "
                          f"{sorted(_TOKENIZERS)}")
    sections = {"text": "tokenize", "chat": "tokenize.chat",
                "pretokenized": "tokenize.pretokenized"}
    own = schema[sections[kind]]
    others = {k for name, section in sections.items() if name != kind for k in schema[section]}
    wrong = sorted(k for k in table if k not in own and k in others)
    if wrong:
        raise ConfigError(f"{source}: [tokenize] {wrong} do not apply to kind={kind!r}")
    return found.read(table, own, source, "tokenize")


_READ_ONCE: dict[tuple[Any, ...], DataRecipe] = {}


def load_recipe(path: str | os.PathLike[str],
                preset: TrainingPreset | None = None) -> DataRecipe:
    """``DataRecipe.from_toml(path, preset)``, read and validated once per process while the
    file is unchanged (its resolved path, size and modification time key the copy kept).

    A framework meets its recipe several times before training (its config, the preflight,
    the model's vocabulary, the loader); they all get the same recipe, whose datasets are then
    listed once (a TorchTitan launch read and listed it 7 times per process). Recipes are
    immutable, so sharing one is safe. A failed read is not kept. Limit: data files added
    after the first read in the same process are not seen by later loaders (changed ones are
    refused when read)."""
    resolved = Path(path).resolve()
    try:
        stat = resolved.stat()
    except OSError:
        return DataRecipe.from_toml(path, preset)  # names what is wrong with the path
    key = (str(resolved), stat.st_size, stat.st_mtime_ns,
           None if preset is None else (preset.framework, repr(sorted(preset.fixed.items()))))
    found = _READ_ONCE.get(key)
    if found is None:
        found = _READ_ONCE[key] = DataRecipe.from_toml(path, preset)
    return found


def read_toml(path: str | os.PathLike[str], what: str = "recipe") -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is a ConfigError naming it."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None


def _demo_asset(kind: str) -> str:
    from zephon.demo.assets import build_demo_assets

    return build_demo_assets()[kind]


def _resolve_path(value: str, base: Path) -> str:
    value = str(value)
    if value.startswith("demo:"):
        kind = value.split(":", 1)[1]
        if kind == "chat":
            from zephon.demo.assets import build_chat_assets

            return build_chat_assets()["chat"]
        if kind != "corpus":
            raise ConfigError(f"unknown demo dataset {value!r}; use demo:corpus or demo:chat")
        return _demo_asset("corpus")
    if is_remote(value):
        return value
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else base / path)


def _resolve_tokenizer(value: str, base: Path) -> str:
    value = str(value)
    if value == "demo:tokenizer":
        return _demo_asset("tokenizer")
    if value == "demo:chat-tokenizer":
        from zephon.demo.assets import build_chat_assets

        return build_chat_assets()["tokenizer"]
    candidate = base / os.path.expanduser(value)
    if looks_local(value) or candidate.is_dir():
        return str(candidate if not Path(value).is_absolute() else Path(value))
    return value
