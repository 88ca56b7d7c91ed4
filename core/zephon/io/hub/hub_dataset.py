"""``HubDataset``: a split of a Hugging Face Hub dataset, read through the shard cache.

The path is parsed when the dataset is made (malformed paths fail at once). The revision is
pinned and the split's files are listed the first time they are needed (see
:mod:`zephon.io.hub.resolve`), and never again for this object: every unit is read at that
commit, and the fingerprint carries it, so a checkpoint taken at another commit is refused.

Planning downloads nothing: a Parquet file's units are its row groups (split into row ranges
when a dataset has too few, exactly as for local files), known from its footer; an
uncompressed JSON Lines file's units are byte ranges computed from its listed size; a
compressed one is a single unit. Only Arrow files read with ``~original`` are downloaded to be
planned. Reading a unit downloads its whole file into the shard cache first
(:mod:`zephon.io.cache.shard_cache`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from zephon.errors import DataError
from zephon.io.cache.shard_cache import (
    CachedFile,
    ContentCheck,
    ShardCache,
    bound_cache,
    require_cache,
)
from zephon.io.dataset import DataFile, Dataset
from zephon.io.fetch_ahead import FetchAhead
from zephon.io.formats import PlanHints, UnitSpec, plan_listed
from zephon.io.hub.client import HubClient
from zephon.io.hub.path import HubPath, parse_hub_path
from zephon.io.hub.resolve import Resolution, resolve
from zephon.io.retry import RetryPolicy
from zephon.io.store_options import StoreOptions


class HubDataset(FetchAhead, Dataset):
    """A Hub dataset split named by an ``hf://`` path; see the module docstring.

    ``token`` overrides the Hugging Face token (``False``: none); ``endpoint`` the Hub URL
    (default: ``HF_ENDPOINT``, else https://huggingface.co).
    """

    path_options = ("token", "endpoint")
    """Keyword options of ``Dataset.from_path`` for ``hf://`` paths."""
    job_shared = False  # its resolution (listing and footers) is shared across ranks already

    def __init__(self, name: str, path: str, fmt: str | None = None, *,
                 token: str | bool | None = None, endpoint: str | None = None):
        super().__init__(name, path, fmt)
        self.hub_path: HubPath = parse_hub_path(path)
        self._token = token
        self._endpoint = endpoint
        self._io = StoreOptions()
        self._client = self._make_client()
        self._cache: ShardCache | None = None
        self._shared = SimpleNamespace(resolution=None)  # shared by bound copies
        self._lock = threading.Lock()

    def _make_client(self) -> HubClient:
        return HubClient(self.hub_path.repo_id, self._endpoint, self._token,
                         RetryPolicy.of(self._io), self._io.timeout_s)

    def __repr__(self) -> str:
        return f"HubDataset({self.name!r}, {self.path!r})"

    # -- options ----------------------------------------------------------------------------
    def bound(self, io_options: StoreOptions) -> HubDataset:
        """A copy that reads through ``io_options``; Hub data needs its shard cache enabled.
        Copies share the pinned resolution, so every pipeline reads the same commit."""
        clone = copy.copy(self)
        clone._fetches = None
        clone.bind(io_options)
        return clone

    def pinned(self, commit: str, source: str | None) -> HubDataset:
        """A copy that reads ``commit`` (with the given source), for resuming a checkpoint
        written before the branch moved; its path, and so its fingerprint's path, is kept."""
        clone = copy.copy(self)
        clone.hub_path = dataclasses.replace(self.hub_path, revision=commit,
                                             source=source or self.hub_path.source)
        clone._shared = SimpleNamespace(resolution=None)
        clone._files = None
        clone._fetches = None
        return clone

    def bind(self, io_options: StoreOptions) -> None:
        """Use ``io_options`` (in place); Hub data needs its shard cache enabled."""
        require_cache(io_options, self.name, self.path, "the Hugging Face Hub")
        self._io = io_options
        self._client = self._make_client()
        self._cache = ShardCache(io_options.cache)

    @property
    def cache(self) -> ShardCache:
        return bound_cache(self._cache, self.name, self.path)

    # -- resolution -------------------------------------------------------------------------
    @property
    def resolution(self) -> Resolution:
        """The pinned commit and the split's files (resolved on first use)."""
        with self._lock:
            if self._shared.resolution is None:
                root = self._cache.root if self._cache is not None else None
                self._shared.resolution = resolve(self.hub_path, self._client, root,
                                                  self.fmt)
            return self._shared.resolution

    @property
    def commit(self) -> str:
        return self.resolution.commit

    def _list_files(self) -> list[DataFile]:
        files = [DataFile(f.path, f.size, f.fmt, f.compression, f.version, context=f.context)
                 for f in self.resolution.files]
        if not files:
            raise DataError(f"dataset {self.name!r}: {self.path} holds no files")
        return files

    def fingerprint(self) -> dict[str, Any]:
        res = self.resolution
        listing = json.dumps([[f.path, f.size, f.version, f.fmt] for f in self.files()])
        return {
            "path": self.path,
            "commit": res.commit,
            "source": res.source,
            "config": res.config,
            "num_files": len(self.files()),
            "files": hashlib.sha256(listing.encode()).hexdigest()[:16],
        }

    def display_name(self, data_file: DataFile) -> str:
        return f"hf://{self.hub_path.repo_id}@{self.commit}/{data_file.path}"

    # -- planning ---------------------------------------------------------------------------
    def plan(self, hints: PlanHints, min_units: int) -> list[tuple[int, UnitSpec]]:
        """All units as (file index, unit), in file order, without downloading shards."""
        files = self.files()
        per_file = max(1, -(-min_units // len(files)))
        groups = {f.path: f.row_groups for f in self.resolution.files}
        units: list[tuple[int, UnitSpec]] = []
        for index, data_file in enumerate(files):
            specs = plan_listed(data_file, hints, per_file, self.local_file,
                                groups.get(data_file.path))
            units.extend((index, spec) for spec in specs)
        return units

    # -- reading ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def local_file(self, data_file: DataFile, *, ahead: bool = False) -> Iterator[str]:
        """The shard in the cache (downloaded if needed), pinned while the block runs.
        ``ahead``: a fetch ahead of the reader (it does not wait for room in the cache)."""
        display = self.display_name(data_file)
        item = CachedFile(Path(data_file.path).name, data_file.size, data_file.version, display)
        commit = self.commit

        def fetch(out: Any) -> None:
            self._client.download(data_file.path, commit, out, display, data_file.size,
                                  lambda: ContentCheck(data_file.version, data_file.size),
                                  self._io.show_progress)

        with self.cache.open(item, fetch, ahead=ahead) as local:
            yield local

