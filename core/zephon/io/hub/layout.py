"""Which files of a repository make up each configuration and split, the way the Hub decides.

Uploaded files:

1. When the dataset card (README.md front matter) declares ``configs``, each entry is a
   configuration: ``config_name``, ``data_files`` (one pattern or a list of patterns for a single
   ``train`` split, a list of ``{split, path}`` entries, or a mapping of split to patterns),
   ``data_dir`` (patterns are relative to it; without ``data_files`` the conventions below
   apply inside it) and ``default: true``.
2. Otherwise there is one configuration, ``default``, whose splits follow the Hub's file-naming
   conventions. The first rule that matches any data file decides for the whole repository:

   a. ``data/{split}-NNNNN-of-NNNNN.*`` names the split (any split name);
   b. a directory named after a split keyword (``train/``, ``data/test/``, ``dev_set/``);
   c. a file name holding a split keyword between separators (``train.jsonl``, ``en-test.csv``);
   d. otherwise every data file belongs to ``train``.

   Keywords: ``train``/``training``; ``validation``/``valid``/``val``/``dev``;
   ``test``/``testing``/``eval``/``evaluation``. Separators are ``-._``, space and digits.

Paths with a component starting with ``.`` or ``__`` are ignored, and a split keeps only the
files of its configuration's most common data format (as the Hub's loaders do).

The Parquet conversion (``refs/convert/parquet``) holds ``{config}/{split}/NNNN.parquet``,
``{config}/partial-{split}/NNNN.parquet`` when the Hub converted only the first part of a large
split, or the older ``{config}/{name}-{split}.parquet`` and
``{config}/{name}-{split}-NNNNN-of-NNNNN.parquet``.

Patterns: ``*`` and ``?`` stay inside one path component, ``**`` spans components, ``[...]`` is
a character class; a pattern without wildcards names a file or a directory (all files below).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from zephon.errors import ConfigError, DataError

DEFAULT_CONFIG = "default"
SPLIT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz", ".lz4")
_KINDS = {
    ".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json",
    ".ndjson": "json", ".csv": "csv", ".tsv": "csv", ".txt": "text", ".tar": "webdataset",
    ".zip": "zip", ".xml": "xml", ".h5": "hdf5", ".hdf5": "hdf5", ".lance": "lance",
}
_SEP = r"[-._ 0-9]"
_SHARDED = re.compile(r"^data/(?P<split>\w+(?:\.\w+)*)-\d{5}-of-\d{5}[^/]*$")
_CONVERTED_DIR = re.compile(r"^(?P<config>[^/]+)/(?P<partial>partial-)?(?P<split>[^/]+)/"
                            r"[^/]+\.parquet$")


@dataclass
class Layout:
    """Configurations of a repository and the files of each split."""

    configs: dict[str, dict[str, list[str]]]
    """Config name -> split name -> file paths (sorted)."""
    default: str | None
    """The config a path without one reads, or None when the path must name one."""
    partial: set[tuple[str, str]] = field(default_factory=set)
    """(config, split) pairs of which the Parquet conversion holds only a first part."""

    def select(self, config: str | None, split: str, where: str) -> tuple[str, list[str]]:
        """(config, files) for a path's config and split; errors list what is available."""
        if not self.configs:
            raise DataError(f"{where}: found no data files")
        if config is None:
            if self.default is None:
                raise ConfigError(
                    f"{where}: the dataset has several configurations, so the path must name "
                    f"one ([config/]split); available configs: {', '.join(sorted(self.configs))}")
            config = self.default
        if config not in self.configs:
            raise ConfigError(f"{where}: unknown config {config!r}; available configs: "
                              f"{', '.join(sorted(self.configs))}")
        splits = self.configs[config]
        if split not in splits:
            raise ConfigError(f"{where}: config {config!r} has no split {split!r}; available "
                              f"splits: {', '.join(sorted(splits))}")
        return config, splits[split]


def data_kind(path: str) -> str | None:
    """The data format family of a file name (compression suffixes ignored), or None."""
    lower = path.lower()
    for suffix in COMPRESSIONS:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    dot = lower.rfind(".")
    return _KINDS.get(lower[dot:]) if dot >= 0 else None


def _visible(path: str) -> bool:
    return not any(part.startswith((".", "__")) for part in path.split("/"))


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a Hub data_files pattern; see the module docstring for its syntax."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("^" + "".join(out) + "$")


def match_patterns(paths: Iterable[str], patterns: list[str], base: str = "") -> list[str]:
    """The files among ``paths`` matched by any pattern (relative to directory ``base``)."""
    paths = list(paths)
    found: set[str] = set()
    for raw in patterns:
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"dataset card: data_files pattern {raw!r} is not a path pattern")
        if raw.startswith(("hf://", "http://", "https://")):
            raise ConfigError(f"dataset card: data_files pattern {raw!r} points outside the "
                              "repository, which Zephon does not read")
        pattern = raw.removeprefix("./")
        full = f"{base.strip('/')}/{pattern}" if base.strip("/") else pattern
        if any(ch in pattern for ch in "*?["):
            regex = glob_regex(full)
            found.update(p for p in paths if regex.match(p))
        else:
            prefix = full.rstrip("/") + "/"
            found.update(p for p in paths if p == full or p.startswith(prefix))
    return sorted(p for p in found if _visible(p))


def _keep_main_kind(splits: dict[str, list[str]]) -> dict[str, list[str]]:
    counts = Counter(data_kind(p) for files in splits.values() for p in files)
    counts.pop(None, None)
    if not counts:
        return splits
    kind = max(sorted(counts), key=lambda k: counts[k])
    return {s: [p for p in files if data_kind(p) == kind] for s, files in splits.items()}


def _keyword_split(text: str, as_directory: bool) -> list[str]:
    found = []
    for split, words in SPLIT_KEYWORDS.items():
        for word in words:
            tail = f"(?:{_SEP}|$)" if as_directory else _SEP
            if re.search(f"(?:^|{_SEP}){word}{tail}", text):
                found.append(split)
                break
    return found


def convention_splits(paths: Iterable[str]) -> dict[str, list[str]]:
    """Splits of a repository without card configs (rules a-d of the module docstring)."""
    data = [p for p in paths if _visible(p) and data_kind(p) is not None]
    sharded: dict[str, list[str]] = {}
    for p in data:
        m = _SHARDED.match(p)
        if m:
            sharded.setdefault(m["split"], []).append(p)
    if sharded:
        return sharded
    for as_directory in (True, False):
        splits: dict[str, list[str]] = {}
        for p in data:
            parts = p.split("/")
            texts = parts[:-1] if as_directory else parts[-1:]
            for split in {s for t in texts for s in _keyword_split(t, as_directory)}:
                splits.setdefault(split, []).append(p)
        if splits:
            return splits
    return {"train": data} if data else {}


def original_layout(paths: list[str], card: dict[str, Any] | None) -> Layout:
    """The configurations of the uploaded files; see the module docstring."""
    entries = (card or {}).get("configs")
    if not entries:
        splits = _keep_main_kind(convention_splits(paths))
        return Layout({DEFAULT_CONFIG: _sorted(splits)} if splits else {}, DEFAULT_CONFIG)
    if not isinstance(entries, list):
        raise ConfigError("dataset card: 'configs' must be a list of configurations")
    configs: dict[str, dict[str, list[str]]] = {}
    default = None
    for entry in entries:
        if not isinstance(entry, dict):
            raise ConfigError(f"dataset card: configuration {entry!r} is not a mapping")
        name = str(entry.get("config_name", DEFAULT_CONFIG))
        base = str(entry.get("data_dir") or "")
        spec = entry.get("data_files")
        if spec is None:
            inside = [p[len(base.strip("/")) + 1:] for p in paths
                      if not base or p.startswith(base.strip("/") + "/")]
            prefix = base.strip("/") + "/" if base else ""
            splits = {s: [prefix + p for p in files]
                      for s, files in convention_splits(inside).items()}
        else:
            splits = {s: match_patterns(paths, pats, base) for s, pats in _split_patterns(spec)}
        configs[name] = _sorted(_keep_main_kind(splits))
        if entry.get("default"):
            default = name
    if default is None:
        if len(configs) == 1:
            default = next(iter(configs))
        elif DEFAULT_CONFIG in configs:
            default = DEFAULT_CONFIG
    return Layout(configs, default)


def _split_patterns(spec: Any) -> list[tuple[str, list[str]]]:
    if isinstance(spec, str):
        return [("train", [spec])]
    if isinstance(spec, dict):
        return [(str(s), [p] if isinstance(p, str) else list(p)) for s, p in spec.items()]
    if isinstance(spec, list) and all(isinstance(p, str) for p in spec):
        return [("train", list(spec))]
    if isinstance(spec, list):
        out = []
        for item in spec:
            if not isinstance(item, dict) or "path" not in item:
                raise ConfigError(f"dataset card: data_files entry {item!r} needs 'split' and "
                                  "'path'")
            paths = item["path"]
            out.append((str(item.get("split", "train")),
                        [paths] if isinstance(paths, str) else list(paths)))
        return out
    raise ConfigError(f"dataset card: data_files {spec!r} is neither a pattern, a list nor a "
                      "mapping")


def conversion_layout(paths: list[str], name: str) -> Layout:
    """The configurations of the Parquet conversion of dataset ``name``."""
    configs: dict[str, dict[str, list[str]]] = {}
    partial: set[tuple[str, str]] = set()
    legacy = re.compile(rf"^(?P<config>[^/]+)/{re.escape(name)}-(?P<split>\w+(?:\.\w+)*?)"
                        r"(?:-\d{5}-of-\d{5})?\.parquet$")
    for p in paths:
        m = _CONVERTED_DIR.match(p) or legacy.match(p)
        if m is None:
            continue
        config, split = m["config"], m["split"]
        if m.groupdict().get("partial"):
            partial.add((config, split))
        configs.setdefault(config, {}).setdefault(split, []).append(p)
    default = next(iter(configs)) if len(configs) == 1 else (
        DEFAULT_CONFIG if DEFAULT_CONFIG in configs else None)
    return Layout({c: _sorted(s) for c, s in configs.items()}, default, partial)


def _sorted(splits: dict[str, list[str]]) -> dict[str, list[str]]:
    return {s: sorted(set(files)) for s, files in splits.items() if files}
