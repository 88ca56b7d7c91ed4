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
    by = "tokens"                   # or "documents"
    repeat = ["wiki"]               # datasets that start a new epoch when they run out
    on_exhausted = "stop"           # or "drain"

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

Every key is checked: an unknown one is an error naming the file and the key.
``demo:corpus`` and ``demo:tokenizer`` name the embedded demo corpus and tokenizer;
``demo:chat`` and ``demo:chat-tokenizer`` a synthetic chat corpus and a tokenizer with a
ChatML-style template, for SFT recipes (``[tokenize] kind = "chat"``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.tokenizer import looks_local

_TOP = {"seed", "lanes", "prefetch", "datasets", "mixture", "tokenize", "pack", "shuffle",
        "batch", "to_training", "cache", "work"}
_SECTIONS = {
    "datasets": {"name", "path", "weight", "fmt"},
    "mixture": {"by", "repeat", "on_exhausted", "primer", "calibration_samples",
                "calibration_shards_max"},
    "tokenize": {"kind", "tokenizer", "field", "add_bos", "add_eos", "max_document_tokens",
                 "batch_size", "chat_template", "tools_field", "train_on", "on_untrainable"},
    "pack": {"algorithm", "max_length", "pad_token_id", "max_open_bins", "flat"},
    "shuffle": {"buffer_size", "seed"},
    "batch": {"microbatch_size", "drop_last"},
    "to_training": {"return_labels", "ignore_index", "eos_mask_loss", "eos_token_id",
                    "return_loss_mask", "return_num_valid_tokens", "position_mode",
                    "return_cu_seqlens", "return_padding_mask", "rename_fields",
                    "exclude_fields", "flatten"},
    "cache": {"root", "limit_bytes"},
    "work": {"shuffle_units", "shuffle_rows", "unit_bytes", "arrow_unit_rows"},
}


@dataclass
class DatasetEntry:
    name: str
    """Dataset name, used by the mixture and in every report."""
    path: str
    """Local file/dir/glob (relative to the recipe), ``hf://`` path, or ``demo:corpus``."""
    weight: float = 1.0
    """Target share before normalization."""
    fmt: str | None = None
    """Force a file format (parquet, jsonl, arrow)."""


@dataclass
class DataRecipe:
    """A validated data recipe; build a Pipeline with :meth:`build`."""

    datasets: list[DatasetEntry]
    seed: int = 0
    lanes: int | None = None
    """Lanes of the run; None lets it default to the data-parallel size (with a warning)."""
    prefetch: int = 4
    mixture: dict[str, Any] = field(default_factory=dict)
    tokenize: dict[str, Any] = field(default_factory=dict)
    pack: dict[str, Any] | None = field(default_factory=lambda: {"algorithm": "wrap"})
    shuffle: dict[str, Any] | None = None
    batch: dict[str, Any] = field(default_factory=dict)
    to_training: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None
    work: dict[str, Any] = field(default_factory=dict)
    source: str = "<dict>"
    """Where the recipe came from, for error messages."""

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> DataRecipe:
        path = Path(path)
        return cls.from_dict(read_toml(path), source=str(path), base_dir=path.parent)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>",
                  base_dir: str | os.PathLike[str] | None = None) -> DataRecipe:
        unknown = sorted(set(data) - _TOP)
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(_TOP)}")
        for section, allowed in _SECTIONS.items():
            value = data.get(section)
            if value is None:
                continue
            items = value if section == "datasets" else [value]
            if not isinstance(items, list):
                raise ConfigError(f"{source}: [[datasets]] must be a list of tables")
            for item in items:
                if not isinstance(item, dict):
                    raise ConfigError(f"{source}: [{section}] must be a table")
                bad = sorted(set(item) - allowed)
                if bad:
                    raise ConfigError(f"{source}: unknown key(s) {bad} in [{section}]; "
                                      f"known: {sorted(allowed)}")
        raw_sets = data.get("datasets") or []
        if not raw_sets:
            raise ConfigError(f"{source}: the recipe names no [[datasets]]")
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        entries = []
        for raw in raw_sets:
            if "name" not in raw or "path" not in raw:
                raise ConfigError(f"{source}: every [[datasets]] entry needs name and path, "
                                  f"got {raw}")
            entries.append(DatasetEntry(str(raw["name"]), _resolve_path(raw["path"], base),
                                        float(raw.get("weight", 1.0)), raw.get("fmt")))
        tokenize = dict(data.get("tokenize") or {})
        if "tokenizer" in tokenize:
            tokenize["tokenizer"] = _resolve_tokenizer(tokenize["tokenizer"], base)
        cache = dict(data["cache"]) if data.get("cache") else None
        if cache and "root" in cache:
            cache["root"] = str(base / os.path.expanduser(cache["root"]))
        recipe = cls(
            datasets=entries,
            seed=int(data.get("seed", 0)),
            lanes=data.get("lanes"),
            prefetch=int(data.get("prefetch", 4)),
            mixture=dict(data.get("mixture") or {}),
            tokenize=tokenize,
            pack=dict(data["pack"]) if "pack" in data else {"algorithm": "wrap"},
            shuffle=dict(data["shuffle"]) if data.get("shuffle") else None,
            batch=dict(data.get("batch") or {}),
            to_training=dict(data.get("to_training") or {}),
            cache=cache,
            work=dict(data.get("work") or {}),
            source=source,
        )
        recipe.validate()
        return recipe

    def validate(self) -> None:
        """Cheap checks that fail before training starts: files, tokenizer, option values."""
        from zephon.io.dataset import Dataset
        from zephon.training import TrainingOptions

        for entry in self.datasets:
            if not entry.path.startswith("hf://"):
                try:
                    Dataset.from_path(entry.name, entry.path, entry.fmt).files()
                except ConfigError:
                    raise
                except ValueError as exc:
                    raise ConfigError(f"{self.source}: dataset {entry.name!r}: {exc}") from None
        tokenizer = self.tokenize.get("tokenizer")
        if tokenizer is None:
            raise ConfigError(f"{self.source}: [tokenize] needs tokenizer = <dir or Hub id>")
        if looks_local(tokenizer) and not Path(tokenizer).is_dir():
            raise ConfigError(f"{self.source}: tokenizer directory {tokenizer!r} does not exist")
        kind = self.tokenize.get("kind", "text")
        if kind not in ("text", "chat"):
            raise ConfigError(f"{self.source}: [tokenize] kind={kind!r} is not 'text' or 'chat'")
        chat_only = {"chat_template", "tools_field", "train_on", "on_untrainable"}
        text_only = {"add_bos", "add_eos"}
        wrong = sorted(set(self.tokenize) & (text_only if kind == "chat" else chat_only))
        if wrong:
            raise ConfigError(f"{self.source}: [tokenize] {wrong} do not apply to "
                              f"kind={kind!r}")
        by = self.mixture.get("by", "tokens")
        if by not in ("tokens", "documents"):
            raise ConfigError(f"{self.source}: [mixture] by={by!r} is not 'tokens' or "
                              "'documents'")
        if self.lanes is not None and (not isinstance(self.lanes, int) or self.lanes <= 0):
            raise ConfigError(f"{self.source}: lanes must be a positive integer")
        options = {k: v for k, v in self.to_training.items() if k != "eos_token_id"}
        if options.get("eos_mask_loss"):
            options["eos_token_id"] = self.to_training.get("eos_token_id", 0)
        try:
            TrainingOptions(**{**options,
                               "rename_fields": dict(options.get("rename_fields", {})),
                               "exclude_fields": tuple(options.get("exclude_fields", ()))})
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: [to_training] {exc}") from None

    # -- building --------------------------------------------------------------------------
    def build(self, *, seq_len: int | None = None, microbatch_size: int | None = None,
              dp_rank: int = 0, dp_world_size: int = 1, lanes: int | None = None,
              process_group: Any = None, prefetch: int | None = None) -> Any:
        """A Pipeline for this rank. ``seq_len`` packs rows to ``seq_len + 1`` tokens unless
        the recipe fixes ``[pack] max_length``; the framework's values win over the recipe's
        only where the recipe leaves them open, and a conflict is an error."""
        from zephon.io import CacheOptions, Dataset, StoreOptions
        from zephon.pipeline import Pipeline
        from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

        datasets = [Dataset.from_path(e.name, e.path, e.fmt) for e in self.datasets]
        mixture = MixtureSpec({e.name: e.weight for e in self.datasets})
        by = self.mixture.get("by", "tokens")
        estimation = None
        if by == "tokens":
            estimation = TokenEstimation(**{k: self.mixture[k] for k in
                                            ("primer", "calibration_samples",
                                             "calibration_shards_max") if k in self.mixture})
        source = StaticMixtureWorkSource(
            datasets, mixture, seed=self.seed, token_estimation=estimation,
            repeat=self.mixture.get("repeat", False),
            on_exhausted=self.mixture.get("on_exhausted", "stop"), **self.work)
        chosen_lanes = _agree("lanes", self.lanes, lanes, self.source)
        pipeline = Pipeline(source).options(
            io_options=StoreOptions(cache=CacheOptions(enabled=True, **self.cache))
            if self.cache else None,
            lanes=chosen_lanes, dp_rank=dp_rank, dp_world_size=dp_world_size,
            prefetch=prefetch if prefetch is not None else self.prefetch,
            process_group=process_group)
        tokenize = dict(self.tokenize)
        tokenizer = tokenize.pop("tokenizer")
        if tokenize.pop("kind", "text") == "chat":
            pipeline = pipeline.tokenize_chat(tokenizer_id=tokenizer, **tokenize)
        else:
            pipeline = pipeline.tokenize(tokenizer_id=tokenizer, **tokenize)
        if self.pack is not None:
            pack = dict(self.pack)
            flat = pack.pop("flat", True)
            max_length = _agree("[pack] max_length", pack.pop("max_length", None),
                                seq_len + 1 if seq_len is not None else None, self.source)
            if max_length is None:
                raise ConfigError(f"{self.source}: [pack] max_length is not set and the "
                                  "framework gave no sequence length")
            if flat:
                pipeline = pipeline.pack_flat(max_length, **pack)
            else:
                pack.pop("pad_token_id", None)
                pipeline = pipeline.pack_sequences(max_length, **pack)
        if self.shuffle:
            pipeline = pipeline.shuffle(**self.shuffle)
        batch = dict(self.batch)
        size = _agree("[batch] microbatch_size", batch.pop("microbatch_size", None),
                      microbatch_size, self.source)
        if size is None:
            raise ConfigError(f"{self.source}: [batch] microbatch_size is not set and the "
                              "framework gave none")
        return pipeline.batch(size, **batch)

    def eos_token_id(self) -> int:
        """``[to_training] eos_token_id``, else the recipe tokenizer's EOS id."""
        eos = self.to_training.get("eos_token_id")
        if eos is None:
            from zephon.tokenizer import resolve_encoder

            eos = resolve_encoder(self.tokenize["tokenizer"], None).special.eos
        if eos is None:
            raise ConfigError(f"{self.source}: eos_mask_loss needs eos_token_id; the tokenizer "
                              "has no EOS token")
        return int(eos)

    def training_options(self) -> dict[str, Any]:
        """Keyword arguments for ``SampleBatch.to_training``, EOS id filled from the tokenizer."""
        options = dict(self.to_training)
        if options.get("eos_mask_loss"):
            options["eos_token_id"] = self.eos_token_id()
        return options


def read_toml(path: str | os.PathLike[str], what: str = "recipe") -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is a ConfigError naming it."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None


def _agree(name: str, recipe_value: Any, framework_value: Any, source: str) -> Any:
    if recipe_value is None:
        return framework_value
    if framework_value is not None and framework_value != recipe_value:
        raise ConfigError(f"{source}: {name} = {recipe_value} conflicts with the framework's "
                          f"{framework_value}; remove it from the recipe or make them agree")
    return recipe_value


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
    if value.startswith("hf://"):
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
