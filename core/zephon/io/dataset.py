"""Datasets: a name plus a set of data files, local or on the Hugging Face Hub.

``Dataset.from_path(name, path)`` accepts a file, a directory (searched recursively), a glob,
or an ``hf://`` path (see :mod:`zephon.io.hub`). Local files are listed once, sorted by path,
and fingerprinted by relative path, size and version (a digest of their last 4 KiB and of
blocks sampled across them, :mod:`zephon.io.file_identity`): a checkpoint taken over one
version of the files refuses to load over another, naming the file that changed.

Local listing rules, the same for files, directories and globs:

- symbolic links are followed, to files and to directories; a file reached by several paths
  (a link to it, a glob matching it twice, a loop of directory links) is read once, under its
  first path in sorted order, and the other paths are reported as skipped;
- every suffix of the format table is read, named or found (``.json`` files are read as JSON
  Lines), except the metadata files ``datasets`` writes beside Arrow data
  (``dataset_info.json``, ``state.json``, ``dataset_dict.json``); other files, hidden ones and
  duplicates are skipped, logged and listed in ``skipped_files()`` (and the pipeline report);
- a FIFO, device or socket, a broken link and a link loop are errors naming the path.

Folders written by ``datasets`` (``Dataset.save_to_disk``) are read through their listing: a
folder whose ``state.json`` has ``_data_files`` holds more ``.arrow`` files than its data once
``load_from_disk(d).map(f)`` has run there (``cache-<hash>.arrow``, the mapped copy; reading
it too would read every row twice). Of the files in such a folder only the listed ones are
read, unless a file is named directly; the others are skipped, logged and listed like any
skipped path. A listed file that is missing, or a ``state.json`` that cannot be parsed beside
a ``dataset_info.json``, is an error naming the ``state.json``. A ``DatasetDict`` folder
(``dataset_dict.json``, one sub-folder per split) is a ConfigError when the path (or a folder
above it) names it, since reading it whole would mix its splits (a test split into
training): name the split's folder (``d/train``), or make one dataset per split. A glob that
matches split folders (``d/*``) reads each of them through its own ``state.json``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.errors import ConfigError, DataError
from zephon.io import file_identity, local_glob
from zephon.io.formats import (
    PlanHints,
    compression_of,
    detect_format,
    parquet_units,
    row_groups_from_tail,
)
from zephon.io.formats.registry import companion_files, described_files, known_formats
from zephon.io.indexed import prefix_of
from zephon.io.store_options import StoreOptions
from zephon.logs import get_logger
from zephon.named_objects import Registry

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One file of a dataset.

    ``path`` is a local path for local datasets and the path inside the repository for Hub
    datasets; ``version`` is what identifies its content, never a modification time. For a
    local file (:func:`zephon.io.file_identity.version_of`): 16 hex digits of the SHA-1 of its
    last 4 KiB, then, for a file longer than that, ``-`` and 16 hex digits of the SHA-1 of
    those 4 KiB followed by five blocks of 256 bytes sampled across the rest (the rest whole
    when it is shorter than the blocks together); with the size, an edit in place that keeps
    the size is seen unless it falls between the blocks. For a Megatron ``.idx``/``.bin``
    pair, 16 hex digits of the SHA-1 of the two files' versions (``path`` is then their common
    prefix and ``size`` their sizes added). For Hub files ``sha256:<hex>`` (LFS and Xet
    files) or ``git-sha1:<blob id>``; for objects ``md5:<hex>`` or ``etag:<etag>``
    (:attr:`~zephon.io.storage.object_info.ObjectInfo.version`).
    """

    path: str
    size: int
    fmt: str
    compression: str | None
    version: str
    row_groups: tuple[int, ...] | None = None
    """Rows of each row group of a Parquet file, read from its footer while listing (the
    listing reads its last 4 KiB anyway), so planning opens it no more; None: unknown."""
    context: str | None = None
    """What a format's index says about this file (a plug-in with ``describe``, such as
    LitData's ``index.json``), for its ``plan`` and ``read``; None: the file speaks for
    itself."""


REMOTE_CLASSES: Registry[type[Dataset]] = Registry("remote dataset class")
"""Remote dataset classes by URL scheme, and under :data:`OBJECT_STORES` the class of every
object-store scheme registered in :mod:`zephon.io.storage`. The package :mod:`zephon.io`
registers them by name (``"module:Class"``): they subclass :class:`Dataset`, so naming them
here would make a circle of imports. A class is imported when a path first names its scheme,
so a scheme's dependencies (``huggingface_hub`` for ``hf``, slow to import; measured:
docs/measurements.md) load only when used. A class takes ``(name, path, fmt, **options)``
and lists its keyword options in ``path_options``."""
OBJECT_STORES = "object stores"


NAMED_FILES = 64
"""Files a local dataset's fingerprint names one by one (more: one digest of them all). Each
costs about 70 bytes in every lane's checkpoint entry."""


class Dataset:
    """A named collection of data files in one format family."""

    job_shared: ClassVar[bool] = True
    """List and plan once per job and hand the listing and the units to the other ranks
    (:meth:`files`, :func:`zephon.work.static_mixture.StaticMixtureWorkSource.plan`); a
    scheme that shares its own resolution across ranks sets it False."""

    def __init__(self, name: str, path: str, fmt: str | None = None,
                 documents: tuple[int, int] | None = None):
        if not name or not isinstance(name, str):
            raise ConfigError(f"Dataset name must be a non-empty string, got {name!r}")
        if fmt is not None and fmt not in known_formats():
            raise ConfigError(f"Dataset {name!r}: fmt={fmt!r} is not one of "
                              f"{known_formats()}")
        if documents is not None:
            documents = tuple(documents)  # type: ignore[assignment]
            if (len(documents) != 2 or not all(isinstance(d, int) for d in documents)
                    or not 0 <= documents[0] <= documents[1]):
                raise ConfigError(f"Dataset {name!r}: documents must be (start, stop) with "
                                  f"0 <= start <= stop, got {documents!r}")
        self.name = name
        self.path = str(path)
        self.fmt = fmt
        self.documents = documents
        self._files: tuple[DataFile, ...] | None = None
        self._skipped: tuple[str, ...] = ()
        self._saved_units: dict[tuple[int, int, int], Any] = {}
        self._fingerprint: dict[str, Any] = {}
        self._fingerprint_of: tuple[DataFile, ...] | None = None  # the files it was made of

    @classmethod
    def from_path(cls, name: str, path: str | os.PathLike[str], fmt: str | None = None,
                  **kwargs: Any) -> Dataset:
        """A dataset from a local file, directory or glob, a Megatron indexed dataset prefix
        (``data/web_text_document`` for ``.idx``/``.bin``; ``documents=(start, stop)`` reads
        a range of its documents), an ``hf://`` path, or an object-store path
        (``s3://bucket/prefix/*.parquet``; see :mod:`zephon.io.storage`)."""
        from zephon.io import storage

        text = os.fspath(path)
        scheme = storage.scheme_of(text)
        if scheme is not None and scheme not in REMOTE_CLASSES:
            storage.get_scheme(scheme)  # a ConfigError naming the known schemes, if unknown
            return REMOTE_CLASSES.get(OBJECT_STORES)(name, text, fmt=fmt, **kwargs)
        if scheme is not None:
            remote = REMOTE_CLASSES.get(scheme)
            known = getattr(remote, "path_options", ())
            unknown = sorted(set(kwargs) - set(known))
            if unknown:
                raise ConfigError(f"Dataset.from_path: unknown option(s) {unknown} for a "
                                  f"{scheme}:// dataset (known: {', '.join(known)})")
            return remote(name, text, fmt=fmt, **kwargs)
        unknown = sorted(set(kwargs) - {"documents"})
        if unknown:
            raise ConfigError(f"Dataset.from_path: unknown option(s) {unknown} for a local "
                              "dataset (known: documents)")
        # Absolute now: the files are listed later, perhaps after the process changed its
        # working directory (the fingerprint counts paths relative to the dataset's root).
        return cls(name, os.path.abspath(os.path.expanduser(text)), fmt, **kwargs)

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, {self.path!r})"

    # -- files -----------------------------------------------------------------------------
    def files(self) -> tuple[DataFile, ...]:
        """The dataset's data files, listed once per process, and once per job when
        ``torch.distributed`` runs several ranks: one rank lists (size and version of every
        file: its last 4 KiB and sampled blocks, :class:`DataFile`) and hands the listing to
        the others (:func:`zephon.distributed.once_per_job`). A rank that finds a file other
        than its listing says so when it reads it (:meth:`local_file`)."""
        if self._files is not None:
            return self._files
        from zephon.distributed import job_store, once_per_job

        if not self.job_shared or job_store() is None:
            self._files = tuple(self._list_files())
        else:
            key = json.dumps(["listing", 1, type(self).__name__, self.path, self.fmt,
                              self.documents])
            listing = json.loads(once_per_job(key, self._encoded_listing))
            self._files = tuple(decoded(entry) for entry in listing["files"])
            self._skipped = tuple(listing["skipped"])
        return self._files

    def adopt_listing(self, files: tuple[DataFile, ...], skipped: tuple[str, ...]) -> None:
        """Take ``files`` as this dataset's listing (from a saved plan) instead of listing;
        a dataset listed already keeps its own."""
        if self._files is None:
            self._files, self._skipped = tuple(files), tuple(skipped)

    def adopt_units(self, key: tuple[int, int, int], units: Any) -> None:
        """Take ``units`` (a UnitTable) as the plan for ``key`` = (``unit_bytes``,
        ``arrow_unit_rows``, ``min_units``), from a saved plan (see :meth:`saved_units`)."""
        self._saved_units[tuple(key)] = units

    def saved_units(self, key: tuple[int, int, int]) -> Any:
        """The units :meth:`adopt_units` gave for ``key``, else None."""
        return self._saved_units.get(tuple(key))

    def holds(self, path: str) -> bool:
        """Whether a file at ``path`` belongs under this dataset's path (a saved plan's file
        must): the named file, a file under the named folder, or one the glob matches."""
        named = self.path
        if any(ch in named for ch in "*?[") and not os.path.lexists(named):
            return bool(local_glob.pattern_regex(named).fullmatch(path))
        if os.path.isdir(named):
            root = os.path.join(named, "")
            return path.startswith(root)
        return path == named or prefix_of(named) == path

    def unplanned_files(self, planned: tuple[DataFile, ...]) -> list[str]:
        """Data files under this dataset's path that ``planned`` (a saved plan's listing)
        lacks, found from the names alone (no file is opened), once per job: one rank lists
        and the others get its answer. Files skipped when the plan was made do not count."""
        from zephon.distributed import once_per_job

        def compute() -> bytes:
            candidates, _, _ = _expand_local(self.path)
            known = {f.path for f in planned}
            extra = [c for c in candidates if c not in known and prefix_of(c) not in known
                     and not any(s.startswith(c + " (") for s in self._skipped)
                     and (detect_format(c) is not None or self.fmt is not None)]
            return json.dumps(extra).encode()

        key = json.dumps(["unplanned", self.path, self.fmt,
                          hashlib.sha256(json.dumps([encoded(f) for f in planned])
                                         .encode()).hexdigest()])
        return json.loads(once_per_job(key, compute))

    def _encoded_listing(self) -> bytes:
        files = self._list_files()
        return json.dumps({"files": [encoded(f) for f in files],
                           "skipped": list(self._skipped)}).encode()

    def skipped_files(self) -> tuple[str, ...]:
        """Paths found but not read, each with the reason: ``"path (reason)"``."""
        self.files()
        return self._skipped

    def _list_files(self) -> list[DataFile]:
        candidates, skipped, dict_folders = _expand_local(self.path)
        if dict_folders:
            raise ConfigError(_dict_folder_message(self.name, dict_folders[0]))
        if not candidates and not skipped:
            raise DataError(f"Dataset {self.name!r}: no files match {self.path!r}")
        candidates = _through_saved_listings(candidates, skipped, self.path)
        claimed, indexes = described_files(candidates, _read_bytes, fmt=self.fmt)
        files: list[DataFile | tuple[str, str, str | None]] = []
        for candidate in candidates:
            if candidate in indexes:
                skipped.append(f"{candidate} (index of the {indexes[candidate]} files beside "
                               "it)")
                continue
            if candidate in claimed:
                files.append((candidate, claimed[candidate][0], None))
                continue
            # A Megatron dataset is found by its .idx and .bin, or named by its prefix; a file
            # of another name beside them is not one (it would list the dataset twice), and
            # asking would cost every file of the listing a stat.
            prefix = (prefix_of(candidate) if candidate == self.path
                      or candidate.endswith((".idx", ".bin")) else None)
            if prefix is not None and (self.fmt in (None, "megatron")):
                if candidate.endswith(".bin"):
                    skipped.append(f"{candidate} (tokens of {prefix}.idx)")
                    continue
                size, version = file_identity.paths_version((prefix + ".idx",
                                                             prefix + ".bin"))
                files.append(DataFile(prefix, size, "megatron", None, version))
                continue
            if self.fmt is not None:
                fmt, compression = self.fmt, compression_of(candidate)
            elif os.path.basename(candidate) in _METADATA and candidate != self.path:
                skipped.append(f"{candidate} (dataset metadata)")
                continue
            elif (detected := detect_format(candidate)) is None:
                skipped.append(f"{candidate} (not a data file)")
                continue
            else:
                fmt, compression = detected
            files.append((candidate, fmt, compression))
        files = _without_companions(files, skipped)
        files = _described(files)
        if claimed:
            files = [dataclasses.replace(f, context=claimed[f.path][1]) if f.path in claimed
                     else f for f in files]
        if not files:
            raise DataError(
                f"Dataset {self.name!r}: no .parquet, .jsonl(.gz/.zst), .json or .arrow files "
                f"under {self.path!r} (pass fmt=... to read other suffixes); skipped: "
                f"{skipped[:5]}")
        self._skipped = tuple(skipped)
        if self.documents is not None and [f.fmt for f in files] != ["megatron"]:
            raise ConfigError(f"Dataset {self.name!r}: documents=... selects documents of one "
                              f"Megatron indexed dataset; {self.path!r} holds {len(files)} "
                              "file(s) of other kinds")
        unexpected = [p for p in skipped if not p.endswith(_PARTS_OF_THE_LAYOUT)]
        if unexpected:  # an index or the metadata beside its files is the layout, not news
            log.warning("Dataset %r: skipped %d path(s), e.g. %s", self.name, len(unexpected),
                        unexpected[:3])
        return files

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content: its files (relative to the dataset's root),
        their sizes and versions, and how versions are made. Where the files live and their
        modification times do not count, so moved or re-staged data resumes. Up to
        :data:`NAMED_FILES` files are named one by one (``versions``), so a checkpoint or a
        rank whose file differs is refused naming it; above that, one digest of them all."""
        files = self.files()
        if self._fingerprint_of is not files:
            root = _root_of(self.path).rstrip(os.sep) + os.sep
            relative = [f.path[len(root):] if f.path.startswith(root)
                        else os.path.relpath(f.path, root) for f in files]
            named = len(files) <= NAMED_FILES
            listing = json.dumps([[name, f.fmt] if named else [name, f.size, f.version, f.fmt]
                                  for name, f in zip(relative, files, strict=True)]
                                 + [self.documents or []])
            self._fingerprint = {"file_identity": file_identity.SCHEME,
                                 "num_files": len(files),
                                 "files": hashlib.sha256(listing.encode()).hexdigest()[:16]}
            if named:
                self._fingerprint["versions"] = {
                    name: f"{f.version} {f.size} bytes" for name, f in zip(relative, files,
                                                                           strict=True)}
            self._fingerprint_of = files
        return copy.deepcopy(self._fingerprint)

    def plan(self, hints: PlanHints, min_units: int) -> Any:
        """All units of the dataset as (file index, unit), in file order: a
        :class:`~zephon.io.unit_table.UnitTable` (or a list of pairs, for a subclass)."""
        from zephon.io.formats import plan_file
        from zephon.io.unit_table import UnitTableBuilder

        files = self.files()
        per_file = max(1, -(-min_units // len(files)))
        units = UnitTableBuilder()
        for index, data_file in enumerate(files):
            # Read where it lies: the listing has just checked it (size and version), and
            # a reader checks it again before reading it (local_file): a second check here
            # would open every file once more.
            if data_file.row_groups is not None:
                planned = parquet_units(data_file.row_groups, per_file)
            else:
                planned = plan_file(data_file.path, data_file.fmt, data_file.compression,
                                    hints, per_file, self.documents, data_file.context)
            for unit in planned:
                units.add(index, unit)
        return units.table()

    def display_name(self, data_file: DataFile) -> str:
        return data_file.path

    @contextlib.contextmanager
    def local_file(self, data_file: DataFile) -> Iterator[str]:
        """A local path to read ``data_file`` from, valid inside the ``with`` block; a file
        that changed since it was listed (its size or its version) is a DataError saying
        so, rather than whatever its new layout makes the reader fail with."""
        _refuse_changed(data_file)
        try:
            yield data_file.path
        except Exception:  # a file changed while it was read: said as such, not as its bytes
            _refuse_changed(data_file)
            raise

    def bound(self, io_options: StoreOptions) -> Dataset:
        """This dataset read with ``io_options``: a bound copy for remote datasets; local ones
        need no options and return themselves. The dataset itself never changes, so pipelines
        built from one dataset object do not affect each other."""
        return self


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


_PARTS_OF_THE_LAYOUT = (" files beside it)", "(dataset metadata)", ".idx)")
"""Endings of the skipped paths that belong to a dataset's documented layout (an index or
the metadata beside its data files, a Megatron ``.bin`` beside its ``.idx``): listed in the
report, not logged."""


def _without_companions(entries: list[Any], skipped: list[str]) -> list[Any]:
    """``entries`` less the metadata files of plug-in formats (MDS's ``index.json``) beside
    their data files, which are added to ``skipped``."""
    pairs = [(e[0], e[1]) for e in entries if isinstance(e, tuple)]
    companions = companion_files(pairs)
    skipped.extend(f"{path} (metadata of the {companions[path]} files beside it)"
                   for path, _ in pairs if path in companions)
    return [e for e in entries if not (isinstance(e, tuple) and e[0] in companions)]


def _refuse_changed(data_file: DataFile) -> None:
    """Raise a DataError when ``data_file`` changed since it was listed."""
    change = _change_since_listing(data_file)
    if change:
        raise DataError(f"{data_file.path}: changed during the run ({change}), or this node "
                        "holds another version than the one the job listed (one rank lists "
                        "for all, or a saved plan). Files must not change while a run reads "
                        "them and every node must hold the same: restore it, or start a new "
                        "run (its checkpoints would be refused for the changed data)")


def _change_since_listing(data_file: DataFile) -> str | None:
    """How a local file differs from its listing (None: the same size and version)."""
    paths = ((data_file.path + ".idx", data_file.path + ".bin") if data_file.fmt == "megatron"
             else (data_file.path,))
    try:
        size, version = file_identity.paths_version(paths)
    except FileNotFoundError:
        return "it was removed"
    if size != data_file.size:
        return f"{data_file.size} bytes when listed, {size} now"
    if version == data_file.version:
        return None
    if len(paths) > 1:
        return "its .idx or .bin differs from when it was listed"
    return file_identity.what_differs(data_file.version, version)


LISTING_THREADS = 16
"""Threads that read the files' tails while listing, where opening a file is slow (a shared
filesystem, where an open waits for a network round trip). Where it is fast (a local disk,
the page cache), threads only contend for the GIL and one thread lists faster than eight
(measured: docs/measurements.md), so the listing starts on one thread and goes threaded only
if its first files take over :data:`SLOW_FILE_S` each."""
SLOW_FILE_S = 300e-6
"""Seconds a file that make the listing threaded: several times what a page-cached Parquet
file costs on one thread (open, 4 KiB read, digest, footer; measured: docs/measurements.md),
so that only a slow filesystem crosses it."""


def _described(entries: list[DataFile | tuple[str, str, str | None]]) -> list[DataFile]:
    """Each ``(path, format, compression)`` of ``entries`` as a DataFile: its size, its version
    (:mod:`zephon.io.file_identity`) and, for Parquet, its row groups from the footer its
    last 4 KiB hold; one open a file, in order (see :data:`LISTING_THREADS`).

    Files are read in batches of :data:`DESCRIBE_BATCH`: first every file of the batch, then
    their digests and footers. Batched, a file costs much less than alternating its read with
    its footer's parse (the system calls and pyarrow's parser each keep the CPU's caches warm
    for the next file; measured: docs/measurements.md)."""
    from concurrent.futures import ThreadPoolExecutor

    def describe(batch: list[DataFile | tuple[str, str, str | None]]) -> list[DataFile]:
        read = [None if isinstance(e, DataFile) else file_identity.read_identity(e[0])
                for e in batch]
        described = []
        for entry, identity in zip(batch, read, strict=True):
            if isinstance(entry, DataFile):
                described.append(entry)
                continue
            path, fmt, compression = entry
            size, tail, sampled = identity
            described.append(DataFile(path, size, fmt, compression,
                                      file_identity.version_of(tail, sampled),
                                      row_groups_from_tail(tail) if fmt == "parquet"
                                      else None))
        return described

    def batches(part: list[Any]) -> list[DataFile]:
        return [f for i in range(0, len(part), DESCRIBE_BATCH)
                for f in describe(part[i:i + DESCRIBE_BATCH])]

    probe = entries[:128]
    started = time.perf_counter()
    described = describe(probe)
    rest = entries[len(probe):]
    slow = probe and (time.perf_counter() - started) / len(probe) > SLOW_FILE_S
    threads = min(LISTING_THREADS, len(rest) // 64) if slow else 1
    if threads <= 1:
        return described + batches(rest)
    step = -(-len(rest) // threads)  # one task a thread: a future a file costs more than the file
    with ThreadPoolExecutor(threads, thread_name_prefix="zephon-list") as pool:
        parts = pool.map(lambda i: batches(rest[i:i + step]), range(0, len(rest), step))
        return described + [data_file for part in parts for data_file in part]


DESCRIBE_BATCH = 256
"""Files the listing reads before it parses them (at most 1.3 MiB held: a tail and the sampled
blocks a file)."""


def encoded(data_file: DataFile) -> list[Any]:
    """``data_file`` as a JSON list (a listing handed to other ranks, a saved plan)."""
    entry = [data_file.path, data_file.size, data_file.fmt, data_file.compression,
             data_file.version, list(data_file.row_groups) if data_file.row_groups else None]
    return [*entry, data_file.context] if data_file.context is not None else entry


def decoded(entry: list[Any]) -> DataFile:
    """The DataFile :func:`encoded` wrote."""
    path, size, fmt, compression, version, groups, *context = entry
    return DataFile(path, size, fmt, compression, version,
                    tuple(groups) if groups is not None else None,
                    context[0] if context else None)


def _root_of(path: str) -> str:
    """The directory a dataset path is relative to: the directory itself, a file's parent, or
    the part of a glob before its first wildcard."""
    if any(ch in path for ch in "*?[") and not os.path.lexists(path):
        prefix = path[:min(path.index(ch) for ch in "*?[" if ch in path)]
        return os.path.dirname(prefix) or "."
    return path if os.path.isdir(path) else os.path.dirname(path) or "."


_SAVED_STATE = "state.json"
_SAVED_INFO = "dataset_info.json"
_DICT_MARKER = "dataset_dict.json"
_METADATA = frozenset({_SAVED_INFO, _SAVED_STATE, _DICT_MARKER})


def _through_saved_listings(candidates: list[str], skipped: list[str], path: str) -> list[str]:
    """``candidates`` less the files of ``save_to_disk`` folders that their ``state.json``
    does not list (added to ``skipped``). One ``stat`` per directory, and one parse per
    ``state.json``, whatever the number of files."""
    listings: dict[str, frozenset[str] | None] = {}
    kept = []
    for candidate in candidates:
        folder = os.path.dirname(candidate) or "."
        if folder not in listings:
            listings[folder] = _saved_listing(folder)
        listed = listings[folder]
        if (listed is None or candidate == path or os.path.basename(candidate) in _METADATA
                or os.path.normpath(candidate) in listed):
            kept.append(candidate)
        else:
            skipped.append(f"{candidate} (not listed in {os.path.join(folder, _SAVED_STATE)})")
    return kept


def _saved_listing(folder: str) -> frozenset[str] | None:
    """The normalized paths of the data files a ``datasets.save_to_disk`` folder lists in its
    ``state.json`` (``_data_files``), or None when ``folder`` is not such a folder."""
    state = os.path.join(folder, _SAVED_STATE)
    if not os.path.isfile(state):
        return None
    saved_by_datasets = os.path.isfile(os.path.join(folder, _SAVED_INFO))
    try:
        with open(state, encoding="utf-8") as fh:
            content = json.load(fh)
    except (OSError, ValueError) as exc:
        if saved_by_datasets:
            raise DataError(f"{state}: cannot be read as the listing of a datasets.save_to_disk "
                            f"folder ({exc}); its data files are unknown") from None
        return None
    if not isinstance(content, dict) or "_data_files" not in content:
        if saved_by_datasets:
            raise DataError(f"{state}: has no _data_files list, so the data files of this "
                            "datasets.save_to_disk folder are unknown")
        return None
    entries = content["_data_files"]
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries):
        raise DataError(f"{state}: _data_files must be a list of {{\"filename\": ...}} "
                        f"entries, got {entries!r:.200}")
    listed = []
    for entry in entries:
        data = os.path.normpath(os.path.join(folder, entry["filename"]))
        if not os.path.isfile(data):
            raise DataError(f"{state}: lists {entry['filename']!r}, which is missing from "
                            f"{folder}; the saved dataset is incomplete")
        listed.append(data)
    return frozenset(listed)


def _dict_folder_message(name: str, folder: str) -> str:
    """Why a DatasetDict folder is not read whole, and what to name instead."""
    try:
        with open(os.path.join(folder, _DICT_MARKER), encoding="utf-8") as fh:
            splits = [str(s) for s in json.load(fh)["splits"]]
    except (OSError, ValueError, KeyError, TypeError):
        splits = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    example = os.path.join(folder, splits[0]) if splits else os.path.join(folder, "<split>")
    return (f"Dataset {name!r}: {folder} is a DatasetDict written by datasets.save_to_disk "
            f"(it holds {_DICT_MARKER}), with splits {splits}; reading it whole would mix "
            f"them, a test split into training. Name one split's folder as the path (e.g. "
            f"{example!r}), or make one dataset per split")


def _expand_local(path: str) -> tuple[list[str], list[str], list[str]]:
    """(files to consider, in sorted order, each real file once; skipped ``"path (reason)"``;
    DatasetDict folders walked into)."""
    skipped: list[str] = []
    dict_folders: list[str] = []
    if any(ch in path for ch in "*?[") and not os.path.lexists(path):
        found = []
        for match in local_glob.expand(path):
            found.extend(_walk(match, skipped, dict_folders) if os.path.isdir(match)
                         else [match])
    elif os.path.isdir(path):
        found = _walk(path, skipped, dict_folders)
    elif os.path.lexists(path) or prefix_of(path) is not None:
        found = [path]
    else:
        raise DataError(f"dataset path {path!r} does not exist")
    files: list[str] = []
    first: dict[tuple[int, int], str] = {}
    for candidate in sorted(set(found)):
        name = os.path.basename(candidate)
        if name.startswith(".") and candidate != path:
            skipped.append(f"{candidate} (hidden)")
            continue
        real = _regular_file(candidate)
        if real in first:
            skipped.append(f"{candidate} (same file as {first[real]})")
            continue
        first[real] = candidate
        files.append(candidate)
    return files, skipped, dict_folders


def _walk(root: str, skipped: list[str], dict_folders: list[str]) -> list[str]:
    """Every file under ``root``, following directory links; a directory reached again (a
    link loop or a second link to it) is not walked twice. Adds what it passes over to
    ``skipped``, and the DatasetDict folders it walks into to ``dict_folders``."""
    found = []
    seen: dict[str, str] = {}
    for current, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            skipped.append(f"{current}/ (same directory as {seen[real]}/)")
            dirs[:] = []
            continue
        seen[real] = current
        skipped.extend(f"{os.path.join(current, d)}/ (hidden)" for d in dirs
                       if d.startswith("."))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if _DICT_MARKER in names:
            dict_folders.append(current)
        found.extend(os.path.join(current, n) for n in names)
    return found


def _regular_file(path: str) -> tuple[int, int]:
    """The identity (device, inode) of ``path``, which must be a regular file (after links):
    paths that reach one file through links share it. One ``stat`` a file, where resolving
    the real path would ``lstat`` every component of it (six for ``/data/web/part.parquet``:
    a large share of the listing's time; measured: docs/measurements.md)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not os.path.lexists(path) and prefix_of(path) is not None:
            _regular_file(path + ".bin")
            return _regular_file(path + ".idx")
        if os.path.islink(path):
            raise DataError(f"{path}: broken symbolic link (points to "
                            f"{os.readlink(path)!r})") from None
        raise DataError(f"dataset file {path!r} does not exist") from None
    except OSError as exc:
        if os.path.islink(path):
            raise DataError(f"{path}: symbolic link that cannot be followed ({exc.strerror})"
                            ) from None
        raise DataError(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket"
                if stat.S_ISSOCK(info.st_mode) else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a file")
        raise DataError(f"{path} is {kind}, not a regular file; datasets read regular files "
                        "(reading it could block forever)")
    return info.st_dev, info.st_ino
