"""Pinning an ``hf://`` path to a commit and listing the files of its split.

1. ``dataset_info`` at the revision (default ``main``; ``refs/convert/parquet`` for
   ``~parquet``) gives the commit and the dataset card's metadata: one request. A revision that
   is already a full commit hash skips it when the node's listing cache has the answer. Gated
   datasets without a token fail here, before anything is downloaded.
2. The node's listing cache, ``<cache root>/listings/<digest>.json`` keyed by endpoint,
   repository, commit, source, config, split and format override, answers the rest when
   present; otherwise one process of the node computes it under a file lock while the others
   wait and then read it. Its folder is private like the shard cache's, no listing is read or
   written through a link, and a full or read-only disk gives an error that names the file
   (:mod:`zephon.io.cache.private_files`).
3. ``list_repo_tree`` at the commit (one request per 1,000 files) and the rules of
   :mod:`zephon.io.hub.layout` give the split's files.
4. Source. ``original`` reads the uploaded files, ``parquet`` the Hub's Parquet conversion.
   Without a source, the uploaded files are read when all are Parquet or JSON Lines
   (``.jsonl``/``.ndjson``, plain, gzip or zstd), which Zephon reads and plans without
   downloading them; otherwise (CSV, text, ``.json`` files that may hold one JSON array,
   Arrow, loading scripts) the conversion is read. The Hub converts only the ``main`` branch,
   so that fallback is refused for another revision.
5. Parquet footers: the last 64 KiB of each Parquet file (one HTTP range request, a second
   when the footer is larger) give the rows of each row group, so planning downloads no shard.
   They are fetched 16 at a time.

Across ranks: when ``torch.distributed`` is initialized with more than one rank, the first rank
that loads the dataset claims its resolution in the process group's key-value store, resolves
it and publishes it there; every other rank waits for it and reads it, so all ranks of all
nodes read one commit even if the branch moves in the meantime, and only one rank lists the
repository. This is not a collective: ranks that never load the dataset take no part. Without
``torch.distributed``, each process pins the revision itself (one request); write a commit hash
in the path to share one pin across separately started processes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub.errors import RevisionNotFoundError

import zephon.artifacts as artifacts
from zephon.errors import ConfigError, DataError
from zephon.field_checks import need_fields
from zephon.io.cache.locks import FileLock
from zephon.io.cache.private_files import private_dir, read_bytes, replace_file
from zephon.io.formats import compression_of, detect_format
from zephon.io.formats.registry import described_files
from zephon.io.hub.client import HubClient
from zephon.io.hub.layout import Layout, conversion_layout, original_layout
from zephon.io.hub.path import HubPath
from zephon.io.hub.retry import LOGIN
from zephon.logs import get_logger

log = get_logger(__name__)

CONVERSION_REF = "refs/convert/parquet"
LISTING_VERSION = 2
FOOTER_PROBE = 64 << 10
FOOTER_THREADS = 16
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_PLANNABLE = re.compile(r"\.(parquet|jsonl|ndjson)(\.gz|\.zst)?$", re.IGNORECASE)


@dataclass
class HubFile:
    """One file of a resolved split."""

    path: str
    """Path inside the repository."""
    size: int
    """Bytes."""
    version: str
    """``sha256:<hex>`` (LFS/Xet files) or ``git-sha1:<hex>`` (git blob id)."""
    fmt: str
    """Format read by :mod:`zephon.io.formats`."""
    compression: str | None
    """``gzip``, ``zstd`` or None."""
    row_groups: list[int] | None = None
    """Rows of each row group (Parquet files), from the footer."""
    context: str | None = None
    """What the format's index says about the file (LitData chunks), see
    :attr:`zephon.io.dataset.DataFile.context`."""


@dataclass
class Resolution:
    """A path pinned to a commit, with the files of its split."""

    repo_id: str
    commit: str
    """Commit the files are read at (of the conversion ref when reading the conversion)."""
    source: str
    """``original`` or ``parquet``: what is actually read."""
    config: str
    split: str
    files: list[HubFile] = field(default_factory=list)
    partial: bool = False
    """True when the Parquet conversion holds only the first part of the split."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Resolution:
        fields = dict(data)
        files = [HubFile(**f) for f in fields.pop("files")]
        return cls(files=files, **fields)


def resolve(hub_path: HubPath, client: HubClient, cache_root: Path | None,
            fmt: str | None = None) -> Resolution:
    """Pin ``hub_path`` and list its split's files; see the module docstring."""
    key = f"{client.endpoint} {hub_path} {fmt}"
    data = shared_across_ranks(key, lambda: _resolve(hub_path, client, cache_root,
                                                     fmt).to_json())
    return Resolution.from_json(data)


def _resolve(hub_path: HubPath, client: HubClient, cache_root: Path | None,
             fmt: str | None) -> Resolution:
    requested = hub_path.source or "auto"
    revision = hub_path.revision or (CONVERSION_REF if requested == "parquet" else "main")

    def listing_key(commit: str) -> dict[str, Any]:
        return {"v": LISTING_VERSION, "endpoint": client.endpoint, "repo": hub_path.repo_id,
                "commit": commit, "source": requested, "config": hub_path.config,
                "split": hub_path.split, "fmt": fmt}

    if cache_root is not None and _COMMIT.match(revision):
        known = _read_listing(cache_root, listing_key(revision))
        if known is not None:
            return Resolution.from_json(known)
    info = client.info(revision)
    if info.gated and not client.has_token():
        raise DataError(
            f"{hub_path}: {hub_path.repo_id} is a gated dataset and no Hugging Face token was "
            f"found. Accept its conditions at {client.endpoint}/datasets/{hub_path.repo_id}, "
            f"then {LOGIN}.")
    log.info("%s: revision %r is commit %s", hub_path, revision, info.sha)

    def compute() -> dict[str, Any]:
        return _list(hub_path, client, info, requested, revision, fmt).to_json()

    return Resolution.from_json(_cached_listing(cache_root, listing_key(info.sha), compute))


def _list(hub_path: HubPath, client: HubClient, info: Any, requested: str, revision: str,
          fmt: str | None) -> Resolution:
    where = str(hub_path)
    if requested == "parquet":
        return _conversion(hub_path, client, info.sha)
    tree = {f.path: f for f in client.tree(info.sha)}
    card = info.card_data.to_dict() if info.card_data is not None else None
    layout = original_layout(sorted(tree), card)
    if requested == "auto" and fmt is None and not layout.configs:
        return _fallback(hub_path, client, revision, "no data files Zephon can read")
    config, names = layout.select(hub_path.config, hub_path.split, where)
    claimed, indexes = described_files(
        names, lambda n: client.tail(n, info.sha, max(1, tree[n].size)),
        lambda n: f"hf://{hub_path.repo_id}@{info.sha}/{n}", set(tree), fmt)
    names = sorted({n for n in names if n not in indexes} | set(claimed))
    unplannable = sorted({Path(n).suffix or n for n in names
                          if not _PLANNABLE.search(n) and n not in claimed})
    if requested == "auto" and fmt is None and unplannable:
        return _fallback(hub_path, client, revision,
                         f"{', '.join(unplannable)} files, which Zephon does not read directly")
    files = [_hub_file(tree[n], fmt, where, claimed.get(n)) for n in names]
    _add_row_groups(client, info.sha, files)
    return Resolution(hub_path.repo_id, info.sha, "original", config, hub_path.split, files)


def _fallback(hub_path: HubPath, client: HubClient, revision: str, why: str) -> Resolution:
    if revision != "main":
        raise ConfigError(
            f"{hub_path}: the split holds {why} at revision {revision!r}, and the Hub's Parquet "
            "conversion covers only the main branch. Read the conversion explicitly with "
            f"@~parquet, or force the uploaded files with @{revision}~original (and fmt=...).")
    log.info("%s: the split holds %s; reading the Hub's Parquet conversion", hub_path, why)
    try:
        info = client.info(CONVERSION_REF)
    except ConfigError as exc:
        if isinstance(exc.__cause__, RevisionNotFoundError):
            raise DataError(f"{hub_path}: the split holds {why}, and the dataset has no Parquet "
                            f"conversion on the Hub ({CONVERSION_REF} does not exist)") from exc
        raise
    return _conversion(hub_path, client, info.sha)


def _conversion(hub_path: HubPath, client: HubClient, commit: str) -> Resolution:
    tree = {f.path: f for f in client.tree(commit)}
    layout: Layout = conversion_layout(sorted(tree), hub_path.name)
    where = f"{hub_path} (Parquet conversion at {commit})"
    config, names = layout.select(hub_path.config, hub_path.split, where)
    partial = (config, hub_path.split) in layout.partial
    if partial:
        log.warning("%s: the Hub converted only the first part of this split to Parquet; the "
                    "rest is not read", hub_path)
    files = [_hub_file(tree[n], None, where) for n in names]
    _add_row_groups(client, commit, files)
    return Resolution(hub_path.repo_id, commit, "parquet", config, hub_path.split, files,
                      partial)


def _hub_file(entry: Any, fmt: str | None, where: str,
              described: tuple[str, str] | None = None) -> HubFile:
    lfs = getattr(entry, "lfs", None)
    version = f"sha256:{lfs.sha256}" if lfs is not None else f"git-sha1:{entry.blob_id}"
    if described is not None:  # a chunk its format's index names (LitData)
        return HubFile(entry.path, int(entry.size), version, described[0], None,
                       context=described[1])
    detected = detect_format(entry.path)
    if fmt is not None:
        kind, compression = fmt, compression_of(entry.path)
    elif detected is None:
        raise DataError(f"{where}: cannot tell the format of {entry.path}; pass fmt=...")
    else:
        kind, compression = detected
    lfs = getattr(entry, "lfs", None)
    version = f"sha256:{lfs.sha256}" if lfs is not None else f"git-sha1:{entry.blob_id}"
    return HubFile(entry.path, int(entry.size), version, kind, compression)


def _add_row_groups(client: HubClient, commit: str, files: list[HubFile]) -> None:
    parquet = [f for f in files if f.fmt == "parquet"]
    if not parquet:
        return
    with ThreadPoolExecutor(min(FOOTER_THREADS, len(parquet))) as pool:
        for f, groups in zip(parquet, pool.map(lambda f: _row_groups(client, commit, f),
                                               parquet)):
            f.row_groups = groups


def _row_groups(client: HubClient, commit: str, f: HubFile) -> list[int]:
    where = f"hf://{client.repo_id}@{commit}/{f.path}"
    if f.size < 12:
        raise DataError(f"{where}: {f.size} bytes is too small for a Parquet file")
    data = client.tail(f.path, commit, min(FOOTER_PROBE, f.size))
    if data[-4:] != b"PAR1":
        raise DataError(f"{where}: not a Parquet file (or an encrypted one): it does not end "
                        "with PAR1")
    need = int.from_bytes(data[-8:-4], "little") + 8
    if need > f.size - 4:
        raise DataError(f"{where}: Parquet footer length {need} does not fit the file")
    if need > len(data):
        data = client.tail(f.path, commit, need)
    try:
        meta = pq.read_metadata(pa.BufferReader(b"PAR1" + data[-need:]))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{where}: unreadable Parquet footer: {exc}") from exc
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


# -- node listing cache ------------------------------------------------------------------------
def _listing_path(root: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return root / "listings" / f"{digest}.json"


LISTING_KIND = "zephon.hub-listing"


def _read_listing(root: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The node's stored listing of ``key`` (a sealed artifact, :mod:`zephon.artifacts`), or
    None when there is none, or it is damaged or changed (it is listed again)."""
    try:
        stored = artifacts.load(read_bytes(_listing_path(root, key)), LISTING_KIND,
                                "Hub listing", lambda f: need_fields(f, "", ("key", "value")))
    except (OSError, artifacts.ArtifactError):
        return None
    value = stored["value"]
    return value if stored["key"] == key and isinstance(value, dict) else None


def _cached_listing(root: Path | None, key: dict[str, Any],
                    compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    if root is None:
        return compute()
    known = _read_listing(root, key)
    if known is not None:
        return known
    path = _listing_path(root, key)
    private_dir(path.parent, "Hub listing cache folder")
    with FileLock(path.with_suffix(".lock")):
        known = _read_listing(root, key)
        if known is not None:
            return known
        value = compute()
        replace_file(path, artifacts.dump(LISTING_KIND, {"key": key, "value": value}),
                     "Hub listing cache file")
        return value


# -- sharing across ranks ----------------------------------------------------------------------
def shared_across_ranks(key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` once per job when torch.distributed is initialized (see the module
    docstring and :func:`zephon.distributed.once_per_job`), else in this process."""
    from zephon.distributed import once_per_job

    return json.loads(once_per_job("hub/" + key, lambda: json.dumps(compute()).encode()))
