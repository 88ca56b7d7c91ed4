"""Reading a recipe: TOML to checked values, every problem collected (:class:`Collector`) and
reported together (:class:`RecipeProblems`), paths resolved against the recipe's folder, and
each section made into its spec."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, DataError
from zephon.io.storage import is_remote
from zephon.io.store_options import CacheOptions
from zephon.ops.base import OperatorSpec
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackFlatSpec, PackSequencesSpec, PackSpec
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.ops.registry import operator_spec_class
from zephon.ops.shuffle import ShuffleSpec
from zephon.recipe.keys import SECTIONS, TOKENIZERS, DatasetEntry, recipe_schema
from zephon.recipe.presets import TrainingPreset
from zephon.recipe.schema import Key, dataclass_keys, read_table_parts
from zephon.text.tokenizer import looks_local


class RecipeProblems(ConfigError):
    """Every problem found in a recipe; ``problems`` holds one message each (each naming the
    recipe file and key, or the data file)."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = list(problems)
        text = problems[0] if len(problems) == 1 else (
            f"{source}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))
        super().__init__(text)


class Collector:
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


def dataset_entry(raw: Any, source: str, base: Path, found: Collector) -> DatasetEntry:
    given = raw
    raw, problems = read_table_parts(raw, recipe_schema()["datasets"], source, "datasets")
    found.problems += problems
    if "name" not in raw or "path" not in raw:
        if problems and isinstance(given, dict) and "name" in given and "path" in given:
            raise RecipeProblems(source, [])  # the wrong type is reported already
        raise ConfigError(f"{source}: every [[datasets]] entry needs name and path, got {raw}")
    if not raw["name"].strip() or not raw["path"].strip():
        raise ConfigError(f"{source}: [[datasets]] name and path must not be empty, got {raw}")
    if raw.get("kind") is not None and raw["kind"] not in TOKENIZERS:
        raise ConfigError(f"{source}: [[datasets]] {raw['name']!r}: kind = {raw['kind']!r} is "
                          f"not one of {sorted(TOKENIZERS)}")
    separators = [k for k in ("add_bos", "add_eos") if raw.get(k)]
    if separators and raw.get("kind") != "pretokenized":
        raise ConfigError(f"{source}: [[datasets]] {raw['name']!r}: {separators[0]} applies to "
                          "a kind = \"pretokenized\" dataset (text documents get BOS and EOS "
                          "from [tokenize] add_bos and add_eos)")
    return DatasetEntry(raw["name"], resolve_path(raw["path"], base),
                        float(raw.get("weight", 1.0)), raw.get("fmt"), raw.get("documents"),
                        raw.get("field"), raw.get("kind"), bool(raw.get("add_bos", False)),
                        bool(raw.get("add_eos", False)))


def tokenizer_spec(kind: str, options: dict[str, Any],
                    datasets: tuple[str, ...] | None = None) -> OperatorSpec:
    options = dict(options)
    tokenizer = options.pop("tokenizer", None)
    if kind == "pretokenized":
        return PretokenizedSpec(**options, datasets=datasets)
    if tokenizer is None:
        raise ConfigError(f"[tokenize] needs tokenizer = <dir or Hub id> for kind={kind!r}")
    return TOKENIZERS[kind](tokenizer_id=tokenizer, **options, datasets=datasets)


def documents_option(entry: DatasetEntry) -> dict[str, Any]:
    return {"documents": tuple(entry.documents)} if entry.documents is not None else {}


def pack_spec(table: dict[str, Any]) -> PackSpec:
    """``[pack]`` as the spec of ``pack_flat`` (``flat = true``, the default) or
    ``pack_sequences``; ``max_length`` open unless given."""
    options = {"max_length": None, **table}
    if options.pop("flat", True):
        return PackFlatSpec(**options)
    if "pad_token_id" in options:
        raise ConfigError("pack_sequences: pad_token_id does not apply (rows are not padded)")
    return PackSequencesSpec(**options)


def op_spec(entry: dict[str, Any]) -> OperatorSpec:
    """One ``[[ops]]`` entry as its operator's spec."""
    options = {k: v for k, v in entry.items() if k not in ("op", "after_tokenize")}
    return operator_spec_class(entry["op"])(**options)


def ops_list(value: Any, source: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{source}: [[ops]] must be a list of tables")
    return value


def op_keys(entry: Any, source: str) -> dict[str, Key]:
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


def read_tokenize(table: Any, source: str, found: Collector) -> dict[str, Any]:
    schema = recipe_schema()
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tokenize] must be a table")
    kind = table.get("kind", "text")
    if kind not in TOKENIZERS:
        raise ConfigError(f"{source}: [tokenize] kind={kind!r} is not one of "
                          f"{sorted(TOKENIZERS)}")
    sections = {"text": "tokenize", "chat": "tokenize.chat",
                "pretokenized": "tokenize.pretokenized"}
    own = schema[sections[kind]]
    others = {k for name, section in sections.items() if name != kind for k in schema[section]}
    wrong = sorted(k for k in table if k not in own and k in others)
    if wrong:
        raise ConfigError(f"{source}: [tokenize] {wrong} do not apply to kind={kind!r}")
    return found.read(table, own, source, "tokenize")


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


def resolve_path(value: str, base: Path) -> str:
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


def resolve_tokenizer(value: str, base: Path) -> str:
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


def recipe_from_dict(recipe_class: Callable[..., Any], data: dict[str, Any], source: str,
                     base_dir: str | os.PathLike[str] | None,
                     datasets: list[DatasetEntry] | None,
                     preset: TrainingPreset | None) -> Any:
    """``recipe_class(**fields)`` (a ``DataRecipe``) from TOML-shaped ``data``: each section
    read and made into its spec, every problem collected; then the recipe's own checks of
    what needs several sections (``_problems``), skipping sections that failed already.
    Raises :class:`RecipeProblems` listing them all."""
    schema = recipe_schema()
    found = Collector()
    top = found.read({k: v for k, v in data.items() if k not in SECTIONS}, schema[""],
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
    entries = [e for e in (found.attempt(lambda raw=raw: dataset_entry(raw, source, base,
                                                                        found))
                           for raw in (raw_sets if isinstance(raw_sets, list) else []))
               if e is not None]
    if len(entries) < (len(raw_sets) if isinstance(raw_sets, list) else 0):
        found.flawed.add("datasets")
    entries += datasets or []
    tokenize = found.attempt(lambda: read_tokenize(data.get("tokenize") or {}, source,
                                                    found))
    if tokenize is None:
        found.flawed.add("tokenize")
        tokenize = {}
    if "tokenizer" in tokenize:
        tokenize["tokenizer"] = resolve_tokenizer(tokenize["tokenizer"], base)
    ops: tuple[list[OperatorSpec], list[OperatorSpec]] = ([], [])
    for entry in found.attempt(lambda: ops_list(data.get("ops"), source), []):
        options = found.attempt(lambda entry=entry: found.read(
            entry, {**schema["ops"], **op_keys(entry, source)}, source, "ops"))
        spec = None if options is None else found.attempt(
            lambda options=options: op_spec(options), prefix=f"{source}: [[ops]] ")
        if spec is None:
            found.flawed.add("ops")
        else:
            ops[bool(options.get("after_tokenize", False))].append(spec)
    cache = sections.get("cache")
    if cache and "root" in cache:
        cache["root"] = str(base / os.path.expanduser(cache["root"]))
    typed = {
        "pack": (lambda: pack_spec(sections.get("pack", {}))) if "pack" in data
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
    recipe = recipe_class(
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
