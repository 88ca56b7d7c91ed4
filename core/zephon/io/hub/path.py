"""The ``hf://`` path grammar for Hub datasets.

::

    hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}

A path names a dataset repository, an optional revision (branch, tag or commit; ``main`` when
left out), an optional source (``original``: the uploaded files, ``parquet``: the Hub's
automatic Parquet conversion; automatic when left out), an optional configuration and a split.
A revision that contains ``/`` (``refs/convert/parquet``, ``refs/pr/1``) is written with
``%2F``. Paths name a split, never a file: the ``hf://datasets/{org}/{name}/...`` file paths
of pandas, Polars and DuckDB are refused with the Zephon path to write instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from zephon.errors import ConfigError

SOURCES = ("original", "parquet")
GRAMMAR = "hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}"

_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_SPLIT = re.compile(r"^\w+(?:\.\w+)*$")
_REVISION = re.compile(r"^[^\s~^:?*\[\\]+$")
_FILE_SUFFIX = re.compile(r"\.(parquet|jsonl?|ndjson|csv|tsv|txt|arrow|gz|zst|zip|tar)$",
                          re.IGNORECASE)
_FILE_SYSTEM_KINDS = ("datasets", "models", "spaces", "buckets")


@dataclass(frozen=True, slots=True)
class HubPath:
    """A parsed ``hf://`` path; see the module docstring."""

    org: str
    """Owner of the repository (user or organization)."""
    name: str
    """Repository name."""
    revision: str | None
    """Branch, tag or commit as written; None means the default (``main``)."""
    source: str | None
    """``original``, ``parquet``, or None (uploaded files when readable, else the conversion)."""
    config: str | None
    """Configuration, or None when the path leaves it out."""
    split: str
    """Split name."""

    @property
    def repo_id(self) -> str:
        return f"{self.org}/{self.name}"

    def __str__(self) -> str:
        spec = ""
        if self.revision is not None or self.source is not None:
            spec = "@" + (quote(self.revision, safe="") if self.revision else "")
            spec += f"~{self.source}" if self.source else ""
        config = f"{self.config}/" if self.config is not None else ""
        return f"hf://{self.repo_id}{spec}/{config}{self.split}"


def _fail(path: str, problem: str, hint: str = "") -> ConfigError:
    return ConfigError(f"invalid Hub path {path!r}: {problem}. Hub paths have the form "
                       f"{GRAMMAR}{hint}")


def parse_hub_path(path: str) -> HubPath:
    """Parse ``path``; raises ConfigError naming what is wrong and the expected form."""
    if not isinstance(path, str) or not path.startswith("hf://"):
        raise _fail(str(path), "it does not start with hf://")
    rest = path[len("hf://"):]
    if any(ch.isspace() for ch in rest) or "?" in rest or "#" in rest:
        raise _fail(path, "it contains whitespace, '?' or '#'")
    parts = rest.split("/")
    if parts[0] in _FILE_SYSTEM_KINDS:
        raise _file_system_path(path, parts)
    if len(parts) < 3:
        raise _fail(path, "it needs an organization, a dataset name and a split",
                    " (for example hf://HuggingFaceFW/fineweb-edu/sample-10BT/train)")
    if any(not part for part in parts):
        raise _fail(path, "it has an empty component (a doubled or trailing '/')")
    org, name_spec, *tail = parts
    name, _, spec = name_spec.partition("@")
    for label, value in (("organization", org), ("dataset name", name)):
        if not _REPO_PART.match(value) or "--" in value or ".." in value:
            raise _fail(path, f"{label} {value!r} is not a valid repository name part")
    revision, source = _parse_spec(path, spec) if "@" in name_spec else (None, None)
    if len(tail) > 2:
        looks_like_file = _FILE_SUFFIX.search(tail[-1]) is not None
        raise _fail(path, "it names a file inside the repository" if looks_like_file else
                    f"it has {len(tail)} components after the dataset, at most 2 "
                    "([config/]split) are allowed",
                    "; Zephon paths name a split, not a file")
    config, split = (None, tail[0]) if len(tail) == 1 else (tail[0], tail[1])
    if _FILE_SUFFIX.search(split):
        raise _fail(path, "it names a file inside the repository",
                    "; Zephon paths name a split, not a file")
    if not _SPLIT.match(split):
        raise _fail(path, f"split {split!r} is not a valid split name (letters, digits and '_', "
                    "with '.' between words)")
    return HubPath(org, name, revision, source, config, split)


def _parse_spec(path: str, spec: str) -> tuple[str | None, str | None]:
    revision_text, tilde, source = spec.partition("~")
    if not revision_text and not tilde:
        raise _fail(path, "'@' is followed by neither a revision nor '~source'")
    if tilde and source not in SOURCES:
        raise _fail(path, f"source {source!r} is not one of {', '.join(SOURCES)}")
    revision = unquote(revision_text) if revision_text else None
    if revision is not None and not _REVISION.match(revision):
        raise _fail(path, f"revision {revision!r} is not a valid branch, tag or commit")
    return revision, (source or None)


def _file_system_path(path: str, parts: list[str]) -> ConfigError:
    kind = parts[0]
    if kind != "datasets":
        return ConfigError(
            f"invalid Hub path {path!r}: Zephon reads datasets only, and its paths do not "
            f"start with {kind}/. Hub paths have the form {GRAMMAR}")
    repo = parts[1:3]
    tail = parts[3:]
    suggestion = None
    if len(repo) == 2 and all(repo) and 1 <= len(tail) <= 2 and all(tail) and not any(
            _FILE_SUFFIX.search(t) for t in tail):
        suggestion = "hf://" + "/".join(repo + tail)
    elif len(repo) == 2 and all(repo):
        suggestion = f"hf://{repo[0]}/{repo[1]}/[{{config}}/]{{split}}"
    instead = f" Write {suggestion} instead" if suggestion else ""
    return ConfigError(
        f"invalid Hub path {path!r}: this is the hf://datasets/... file path form of pandas, "
        f"Polars and DuckDB. Zephon paths name a dataset and a split, not a file, and have "
        f"no datasets/ prefix: {GRAMMAR}.{instead} (for example "
        "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train, not "
        "hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train).")
