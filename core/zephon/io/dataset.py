"""Datasets: a name plus a set of data files, local or on the Hugging Face Hub.

``Dataset.from_path(name, path)`` accepts a file, a directory (searched recursively), a glob,
or an ``hf://`` path (see :mod:`zephon.io.hub`). Local files are listed once, sorted by path,
and fingerprinted by path, size and modification time: a checkpoint taken over one version of
the files refuses to load over another.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, DataError
from zephon.io.formats import FORMATS, PlanHints, UnitSpec, compression_of, detect_format
from zephon.io.options import StoreOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One file of a dataset.

    ``path`` is a local path for local datasets and the path inside the repository for Hub
    datasets; ``version`` is what identifies its content (mtime for local files, the blob id for
    Hub files).
    """

    path: str
    size: int
    fmt: str
    compression: str | None
    version: str


class Dataset:
    """A named collection of data files in one format family."""

    def __init__(self, name: str, path: str, fmt: str | None = None):
        if not name or not isinstance(name, str):
            raise ConfigError(f"Dataset name must be a non-empty string, got {name!r}")
        if fmt is not None and fmt not in FORMATS:
            raise ConfigError(f"Dataset {name!r}: fmt={fmt!r} is not one of {FORMATS}")
        self.name = name
        self.path = str(path)
        self.fmt = fmt
        self._files: tuple[DataFile, ...] | None = None

    @classmethod
    def from_path(cls, name: str, path: str | os.PathLike[str], fmt: str | None = None,
                  **kwargs: Any) -> Dataset:
        """A dataset from a local file, directory or glob, or an ``hf://`` path."""
        text = os.fspath(path)
        if text.startswith("hf://"):
            from zephon.io.hub.dataset import HubDataset

            unknown = sorted(set(kwargs) - {"token", "endpoint"})
            if unknown:
                raise ConfigError(f"Dataset.from_path: unknown option(s) {unknown} for an "
                                  "hf:// dataset (known: token, endpoint)")
            return HubDataset(name, text, fmt=fmt, **kwargs)
        if kwargs:
            raise ConfigError(f"Dataset.from_path: unknown option(s) {sorted(kwargs)} "
                              "for a local dataset")
        return cls(name, text, fmt)

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, {self.path!r})"

    # -- files -----------------------------------------------------------------------------
    def files(self) -> tuple[DataFile, ...]:
        """The dataset's data files, listed once."""
        if self._files is None:
            self._files = tuple(self._list_files())
        return self._files

    def _list_files(self) -> list[DataFile]:
        candidates = _expand_local(self.path)
        if not candidates:
            raise DataError(f"Dataset {self.name!r}: no files match {self.path!r}")
        files = []
        named = os.path.isfile(self.path)
        for candidate in candidates:
            detected = detect_format(candidate)
            if detected and not named and ".json" in candidate.lower() and \
                    ".jsonl" not in candidate.lower() and self.fmt is None:
                # A .json file in a directory is more often metadata (dataset_info.json,
                # state.json) than JSON Lines: read it only when named or with fmt="jsonl".
                continue
            if self.fmt is not None:
                fmt, compression = self.fmt, compression_of(candidate)
            elif detected is None:
                continue
            else:
                fmt, compression = detected
            files.append(DataFile(candidate, Path(candidate).stat().st_size, fmt, compression,
                                  _tail_digest(candidate)))
        skipped = len(candidates) - len(files)
        if not files:
            raise DataError(
                f"Dataset {self.name!r}: no .parquet, .jsonl(.gz/.zst) or .arrow files under "
                f"{self.path!r} (pass fmt=... to read other suffixes)")
        if skipped:
            examples = sorted(set(candidates) - {f.path for f in files})[:3]
            log.warning("Dataset %r: skipped %d file(s) that are not data files, e.g. %s",
                        self.name, skipped, examples)
        return files

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content: its files (relative to the dataset's root),
        their sizes and a digest of their last 4 KiB (a Parquet footer). Where the files live
        and their modification times do not count, so moved or re-staged data resumes."""
        root = _root_of(self.path)
        listing = json.dumps([[os.path.relpath(f.path, root), f.size, f.version, f.fmt]
                              for f in self.files()])
        return {
            "num_files": len(self.files()),
            "files": hashlib.sha256(listing.encode()).hexdigest()[:16],
        }

    def plan(self, hints: PlanHints, min_units: int) -> list[tuple[int, UnitSpec]]:
        """All units of the dataset as (file index, unit), in file order."""
        from zephon.io.formats import plan_file

        files = self.files()
        per_file = max(1, -(-min_units // len(files)))
        units: list[tuple[int, UnitSpec]] = []
        for index, data_file in enumerate(files):
            with self.local_file(data_file) as local:
                for unit in plan_file(local, data_file.fmt, data_file.compression, hints,
                                      per_file):
                    units.append((index, unit))
        return units

    def display_name(self, data_file: DataFile) -> str:
        return data_file.path

    @contextlib.contextmanager
    def local_file(self, data_file: DataFile) -> Iterator[str]:
        """A local path to read ``data_file`` from, valid inside the ``with`` block."""
        yield data_file.path

    def bound(self, io_options: StoreOptions) -> Dataset:
        """This dataset read with ``io_options``: a bound copy for remote datasets; local ones
        need no options and return themselves. The dataset itself never changes, so pipelines
        built from one dataset object do not affect each other."""
        return self


def _tail_digest(path: str, size: int = 4096) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - size))
        return hashlib.sha1(fh.read()).hexdigest()[:16]


def _root_of(path: str) -> str:
    """The directory a dataset path is relative to: the directory itself, a file's parent, or
    the part of a glob before its first wildcard."""
    if any(ch in path for ch in "*?["):
        prefix = path[:min(path.index(ch) for ch in "*?[" if ch in path)]
        return os.path.dirname(prefix) or "."
    return path if os.path.isdir(path) else os.path.dirname(path) or "."


def _expand_local(path: str) -> list[str]:
    if any(ch in path for ch in "*?["):
        matches = glob.glob(path, recursive=True)
        out: list[str] = []
        for match in matches:
            out.extend(_expand_local(match) if os.path.isdir(match) else [match])
        return sorted(set(out))
    if os.path.isdir(path):
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found.extend(os.path.join(root, n) for n in names if not n.startswith("."))
        return sorted(found)
    if os.path.exists(path):
        return [path]
    raise DataError(f"dataset path {path!r} does not exist")
