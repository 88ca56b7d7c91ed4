"""``DataRecipe``: a recipe read and validated, the checks that need several sections, and what it
builds (its tokenizing operators, work source and, through :mod:`zephon.recipe.resolve`, a
rank's Pipeline)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.io.storage import is_remote
from zephon.io.store_options import CacheOptions
from zephon.loader_options import LoaderOptions
from zephon.ops.base import OperatorSpec, check_order
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackFlatSpec, PackSpec
from zephon.ops.shuffle import ShuffleSpec
from zephon.recipe.keys import (
    ESTIMATION_KEYS,
    MIX_SOURCE_KEYS,
    WORK_SOURCE_KEYS,
    DatasetEntry,
)
from zephon.recipe.parse import (
    Collector,
    RecipeProblems,
    documents_option,
    read_toml,
    recipe_from_dict,
    tokenizer_spec,
)
from zephon.recipe.presets import TrainingPreset
from zephon.recipe.resolve import FrameworkValues, ResolvedRecipe
from zephon.text.tokenizer import looks_local
from zephon.training import TrainingOptions
from zephon.work.estimation import TokenEstimation
from zephon.work.static_mixture import StaticMixtureWorkSource


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
        :class:`TrainingPreset`). Every problem, of every section, is listed in one
        :class:`RecipeProblems` (:func:`zephon.recipe.parse.recipe_from_dict`)."""
        return recipe_from_dict(cls, data, source, base_dir, datasets, preset)

    @property
    def mix_by(self) -> str:
        """``"tokens"`` or ``"documents"``; see the module docstring for the default."""
        by = self.mixture.get("by")
        if by is None:
            by = "tokens" if self.mixture.get("stages") or any(
                k in self.mixture for k in ESTIMATION_KEYS) else "documents"
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
        found = Collector()
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
            dataset = Dataset.from_path(entry.name, entry.path, entry.fmt,
                                        **documents_option(entry))
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
        options = {k: self.mixture[k] for k in MIX_SOURCE_KEYS if k in self.mixture}
        work = {k: v for k, v in self.work.items() if k in ("unit_bytes", "arrow_unit_rows")}
        sections = {"seed": "", **{k: "[work] " for k in WORK_SOURCE_KEYS}}
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
            estimation = TokenEstimation(**{k: self.mixture[k] for k in ESTIMATION_KEYS
                                            if k in self.mixture})
        if not datasets:
            return None
        from zephon.work import MixtureSchedule, MixtureSpec, ScheduledMixtureWorkSource

        options = {k: self.mixture[k] for k in MIX_SOURCE_KEYS if k in self.mixture}
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
            return [tokenizer_spec(kind, options)]
        shared = {k: v for k, v in options.items() if k in ("tokenizer", "max_document_tokens")}
        specs = []
        for (own_kind, field_name, add_bos, add_eos), names in groups.items():
            own = dict(options if own_kind == kind else shared)
            if field_name is not None:
                own["field"] = field_name
            if own_kind == "pretokenized" and kind != "pretokenized":
                own.update(self._tokenizer_ids(names, add_bos, add_eos))
            specs.append(tokenizer_spec(own_kind, own, tuple(names)))
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
        from zephon.text.tokenizer import resolve_encoder

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
            from zephon.text.tokenizer import resolve_encoder

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
