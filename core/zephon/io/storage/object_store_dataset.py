"""``ObjectStoreDataset``: the objects under ``scheme://bucket/prefix`` (or a glob), read
through the shard cache; what ``Dataset.from_path`` returns for every registered
object-store scheme (:mod:`zephon.io.storage`).

Listing: one prefix listing (the key up to the last ``/`` before the first wildcard), matched
against the glob with the local glob's rules (``*`` within a component, ``**`` across them,
hidden components skipped). A key without wildcards is one object (looked up by name), or
every object below it as a folder. Files are kept in key order; keys that are not data
files, or that the store's client cannot request, are listed in ``skipped_files()`` with the
reason (names escaped), and logged unless they are how a documented layout looks (an index or
metadata beside its files, a folder marker). Under ``torch.distributed`` one
rank lists (and reads the footers) for the job and hands the listing to the others.

Planning downloads nothing: a Parquet file's units are its row groups, from its footer read
by range while listing (one or two range requests a file, 16 at a time); an uncompressed JSON
Lines file's units are byte ranges of its listed size; a compressed one is one unit. Arrow
files are downloaded to be planned. Reading a unit downloads its whole object into the shard
cache (once per node; a size limit evicts least recently used shards no reader holds),
pinned to the listed version: an object rewritten during the run is an error naming it.

Fingerprint: the keys (relative to the listing prefix, so a copied bucket resumes), sizes,
versions and formats. Up to :data:`NAMED_OBJECTS` objects are listed in it by key, so a
checkpoint whose object changed since is refused naming that object; above that, a digest.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath
from typing import Any

from zephon.errors import ConfigError, DataError
from zephon.io import local_glob
from zephon.io.cache.shard_cache import CachedFile, ShardCache, bound_cache, require_cache
from zephon.io.dataset import _METADATA, DataFile, Dataset
from zephon.io.fetch_ahead import FetchAhead
from zephon.io.formats import (
    PlanHints,
    compression_of,
    detect_format,
    plan_listed,
    row_groups_from_tail,
)
from zephon.io.formats.registry import companion_files, described_files
from zephon.io.printable import printable
from zephon.io.storage import ObjectInfo, ObjectStore, get_scheme, split_url
from zephon.io.store_options import StoreOptions
from zephon.logs import get_logger

log = get_logger(__name__)

FOOTER_GUESS = 64 << 10
"""Bytes read from a Parquet object's end while listing: the whole footer of most files (a
row group costs ~100 bytes of footer per column), else a second request reads the rest."""
FOOTER_THREADS = 16
"""Footer requests in flight while listing: latency-bound, so threads overlap round trips."""
NAMED_OBJECTS = 64
"""Objects a fingerprint names one by one (more: a digest of them all). Each costs about 80
bytes in every lane's checkpoint entry: 64 keep a dataset's share near 5 KB a lane."""
_EXPECTED_SKIPS = ("(folder marker)", "(dataset metadata)", " files beside it)")
"""Skips that are how the documented layouts look (folder markers, an index or metadata
beside the data files it describes): listed in ``skipped_files()`` and the report, not
logged."""


class ObjectStoreDataset(FetchAhead, Dataset):
    """The data files under an object-store path; see the module docstring. Keyword options
    are the scheme's (``endpoint``, ``region``, ``profile`` for ``s3``)."""

    def __init__(self, name: str, path: str, fmt: str | None = None, **options: Any):
        super().__init__(name, path, fmt)
        self.scheme, self.bucket, self.pattern = split_url(path)
        scheme = get_scheme(self.scheme)
        unknown = sorted(set(options) - set(scheme.options))
        if unknown:
            raise ConfigError(f"Dataset {name!r}: unknown option(s) {unknown} for a "
                              f"{self.scheme}:// dataset (known: {', '.join(scheme.options)})")
        self._options = options
        self._io = StoreOptions()
        self._store: ObjectStore | None = None
        self._cache: ShardCache | None = None

    def __repr__(self) -> str:
        return f"ObjectStoreDataset({self.name!r}, {self.path!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # a client is opened again in the process that reads
        state["_fetches"] = None
        return state

    # -- options ----------------------------------------------------------------------------
    def bound(self, io_options: StoreOptions) -> ObjectStoreDataset:
        """A copy that reads through ``io_options``, whose shard cache must be enabled."""
        require_cache(io_options, self.name, self.path, "an object store")
        clone = copy.copy(self)
        clone._io = io_options
        clone._store = None
        clone._cache = ShardCache(io_options.cache)
        clone._fetches = None
        return clone

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = get_scheme(self.scheme).open(self.bucket, self._io, **self._options)
        return self._store

    @property
    def cache(self) -> ShardCache:
        return bound_cache(self._cache, self.name, self.path)

    # -- listing ----------------------------------------------------------------------------
    def _prefix(self) -> str:
        """The key prefix the listing asks for."""
        pattern = self.pattern
        magic = [pattern.index(c) for c in "*?[" if c in pattern]
        if not magic:
            return pattern
        head = pattern[:min(magic)]
        return head[:head.rfind("/") + 1]

    def holds(self, path: str) -> bool:
        """Whether the object key ``path`` belongs under this dataset's path."""
        if any(c in self.pattern for c in "*?["):
            return bool(local_glob.pattern_regex(self.pattern).fullmatch(path))
        return path == self.pattern or path.startswith(self.pattern.rstrip("/") + "/")

    def unplanned_files(self, planned: tuple[DataFile, ...]) -> list[str]:
        """Objects under the path that a saved plan lacks: not looked for (a listing of the
        store is a request per 1,000 objects); ``zephon check`` compares them."""
        return []

    def _listed(self, prefix: str) -> list[ObjectInfo]:
        """The objects the pattern may name: the listing of ``prefix`` for a glob or a folder;
        for a key without wildcards, that one object when the store has it (``head``), else
        the folder below it. Stores list by whole path segments (``s3://b/chat/chat.jsonl``
        listed as a prefix is the folder ``chat/chat.jsonl/``), so one key is asked for by
        name. A plug-in without ``head`` lists by string prefix, which finds both."""
        pattern = self.pattern
        head = getattr(self.store, "head", None)
        if head is None or not pattern or pattern.endswith("/") or any(
                c in pattern for c in "*?["):
            return self.store.list(prefix)
        found = head(pattern)
        return [found] if found is not None else self.store.list(pattern + "/")

    def _list_files(self) -> list[DataFile]:
        prefix = self._prefix()
        listed = sorted(self._listed(prefix), key=lambda o: o.key)
        pattern = self.pattern
        if any(c in pattern for c in "*?["):
            regex = local_glob.pattern_regex(pattern)
            matched = [o for o in listed if regex.fullmatch(o.key)]
        else:
            exact = [o for o in listed if o.key == pattern]
            folder = pattern.rstrip("/") + "/" if pattern else ""
            matched = exact or [o for o in listed if o.key.startswith(folder)]
        if not matched:
            raise DataError(f"Dataset {self.name!r}: no objects match {self.path!r} "
                            f"({len(listed)} object(s) under {self.store.url}/{prefix})")
        skipped: list[str] = []
        chosen: list[tuple[ObjectInfo, str, str | None]] = []
        by_key = {info.key: info for info in matched}
        claimed, indexes = described_files(
            list(by_key), lambda key: self.store.read_range(by_key[key], 0, by_key[key].size),
            lambda key: f"{self.store.url}/{key}", fmt=self.fmt)
        for info in matched:
            shown = f"{self.store.url}/{printable(info.key)}"
            name = PurePosixPath(info.key).name
            relative = info.key[len(prefix):]
            if info.problem:
                skipped.append(f"{shown} ({info.problem})")
            elif info.key.endswith("/"):
                skipped.append(f"{shown} (folder marker)")
            elif any(part.startswith(".") for part in relative.split("/")):
                skipped.append(f"{shown} (hidden)")
            elif info.key in indexes:
                skipped.append(f"{shown} (index of the {indexes[info.key]} files beside it)")
            elif info.key in claimed:
                chosen.append((info, claimed[info.key][0], None))
            elif self.fmt is not None:
                chosen.append((info, self.fmt, compression_of(name)))
            elif name in _METADATA:
                skipped.append(f"{shown} (dataset metadata)")
            elif (detected := detect_format(name)) is None:
                skipped.append(f"{shown} (not a data file)")
            elif detected[0] == "megatron":
                skipped.append(f"{shown} (Megatron indexed data is read from local disk)")
            else:
                chosen.append((info, *detected))
        companions = companion_files([(info.key, fmt) for info, fmt, _ in chosen])
        skipped += [f"{self.store.url}/{printable(info.key)} (metadata of the "
                    f"{companions[info.key]} files beside it)"
                    for info, _, _ in chosen if info.key in companions]
        chosen = [entry for entry in chosen if entry[0].key not in companions]
        if not chosen:
            raise DataError(f"Dataset {self.name!r}: no .parquet, .jsonl(.gz/.zst), .json or "
                            f".arrow objects match {self.path!r} (pass fmt=... to read other "
                            f"suffixes); skipped: {skipped[:5]}")
        unexpected = [entry for entry in skipped if not entry.endswith(_EXPECTED_SKIPS)]
        if unexpected:
            log.warning("Dataset %r: skipped %d object(s), e.g. %s (all in skipped_files() "
                        "and the report)", self.name, len(unexpected), unexpected[:3])
        self._skipped = tuple(skipped)
        with ThreadPoolExecutor(FOOTER_THREADS, thread_name_prefix="zephon-footer") as pool:
            groups = list(pool.map(
                lambda entry: self._row_groups(entry[0]) if entry[1] == "parquet" else None,
                chosen))
        return [DataFile(info.key, info.size, fmt, compression, info.version, rows,
                         claimed[info.key][1] if info.key in claimed else None)
                for (info, fmt, compression), rows in zip(chosen, groups, strict=True)]

    def _row_groups(self, info: ObjectInfo) -> tuple[int, ...]:
        """The rows of each row group of a Parquet object, from its footer (by range)."""
        shown = f"{self.store.url}/{info.key}"
        if info.size < 12:
            raise DataError(f"{shown}: {info.size} bytes is too short for a Parquet file")
        start = max(0, info.size - FOOTER_GUESS)
        tail = self.store.read_range(info, start, info.size)
        if tail[-4:] != b"PAR1":
            raise DataError(f"{shown}: not a Parquet file (it does not end with PAR1)")
        needed = int.from_bytes(tail[-8:-4], "little") + 8
        if needed > len(tail):
            if needed > info.size:
                raise DataError(f"{shown}: its Parquet footer claims {needed} bytes, more "
                                f"than the object's {info.size}")
            tail = self.store.read_range(info, info.size - needed, info.size)
        groups = row_groups_from_tail(tail)
        if groups is None:
            raise DataError(f"{shown}: its Parquet footer cannot be parsed")
        return groups

    def _info(self, data_file: DataFile) -> ObjectInfo:
        return ObjectInfo(data_file.path, data_file.size, data_file.version)

    # -- identity ---------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        files = self.files()
        if self._fingerprint_of is not files:
            prefix = self._prefix()
            rows = [[f.path[len(prefix):], f.size, f.version, f.fmt] for f in files]
            if len(rows) <= NAMED_OBJECTS:
                identity: dict[str, Any] = {
                    "objects": {key: f"{version} {size} bytes {fmt}"
                                for key, size, version, fmt in rows}}
            else:
                listing = json.dumps(rows)
                identity = {"files": hashlib.sha256(listing.encode()).hexdigest()[:16]}
            self._fingerprint = {"num_files": len(files), **identity}
            self._fingerprint_of = files
        return dict(self._fingerprint)

    def display_name(self, data_file: DataFile) -> str:
        return f"{self.scheme}://{self.bucket}/{data_file.path}"

    # -- planning ---------------------------------------------------------------------------
    def plan(self, hints: PlanHints, min_units: int) -> Any:
        from zephon.io.unit_table import UnitTableBuilder

        files = self.files()
        per_file = max(1, -(-min_units // len(files)))
        units = UnitTableBuilder()
        for index, data_file in enumerate(files):
            for spec in plan_listed(data_file, hints, per_file, self.local_file):
                units.add(index, spec)
        return units.table()

    PEEK_BYTES = 64 << 10
    """Bytes of an uncompressed JSON Lines object :meth:`peek_file` reads (its first line
    must end inside them)."""

    @contextlib.contextmanager
    def peek_file(self, data_file: DataFile) -> Iterator[str | None]:
        """A small local stand-in for ``data_file`` that holds its schema, for checking fields
        without downloading it: a Parquet object's footer (one or two range requests) behind
        the magic bytes, or the first 64 KiB of an uncompressed JSON Lines object. None for
        other kinds (checked when read)."""
        import tempfile

        info = self._info(data_file)
        if data_file.fmt == "parquet":
            size = min(info.size, FOOTER_GUESS)
            tail = self.store.read_range(info, info.size - size, info.size)
            needed = int.from_bytes(tail[-8:-4], "little") + 8
            if needed > len(tail):
                tail = self.store.read_range(info, info.size - needed, info.size)
            head = b"PAR1" + tail[-needed:]
        elif data_file.fmt == "jsonl" and data_file.compression is None:
            head = self.store.read_range(info, 0, min(info.size, self.PEEK_BYTES))
        else:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="zephon-peek-") as folder:
            path = os.path.join(folder, os.path.basename(data_file.path))
            with open(path, "wb") as fh:
                fh.write(head)
            yield path

    # -- reading ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def local_file(self, data_file: DataFile, *, ahead: bool = False) -> Iterator[str]:
        """The object in the shard cache (downloaded if needed), pinned while the block
        runs. ``ahead``: a fetch ahead of the reader (it does not wait for room in the
        cache)."""
        display = self.display_name(data_file)
        item = CachedFile(os.path.basename(data_file.path), data_file.size, data_file.version,
                          display)
        info = self._info(data_file)

        def fetch(out: Any) -> Any:
            return self.store.download(info, out, display, self._io.show_progress)

        with self.cache.open(item, fetch, ahead=ahead) as local:
            yield local

