"""File-format plug-ins: a new format is one module and one :func:`register_format` call.

Zephon reads Parquet, JSON Lines (plain, ``.gz``, ``.zst``), Arrow IPC and Megatron indexed
datasets itself (:mod:`zephon.io.formats`, one module each), and Mosaic Streaming's MDS shards
and LitData's optimized datasets through plug-ins it ships (:mod:`zephon.io.formats.mds`,
:mod:`zephon.io.formats.litdata`). Any other format is a :class:`FileFormat`: its
file suffixes, how a file is cut into units, how a unit is read, and (for ``zephon check``)
which fields a file has. Once registered, it is detected by suffix in local folders and globs
and in every object store, named by ``fmt=`` or a recipe's ``fmt``, planned, read, resumed
and fingerprinted like the built-in formats::

    register_format(FileFormat("toy", (".toy",), plan=plan_toy, read=read_toy))

A unit is a :class:`~zephon.io.formats.UnitSpec` whose meaning is the format's own (rows
``start..stop`` of the file, say); its rows must come out the same, in the same order, every
time it is read, since exact resume counts rows into units. Remote files are read from the
shard cache, so ``plan`` and ``read`` always receive a local path.

Some formats keep what their files hold in a separate index (LitData's ``index.json``: the
field names, encodings and item counts of its ``chunk-*.bin`` files). Such a format has a
``describe`` hook: the listing reads each companion file (locally, or with one request from a
store, once per job), ``describe`` names the files it describes and a context string for each,
and those files are of this format whatever their suffix. The context travels with the file
(:attr:`zephon.io.dataset.DataFile.context`, in listings shared between ranks and in saved
plans) and is passed to ``plan``, ``read`` and ``fields`` as ``context=``, so a file read from
the shard cache, with no index beside it, is still understood.
"""

from __future__ import annotations

from collections.abc import Callable

from zephon.errors import ConfigError, DataError
from zephon.io.formats.file_format import FieldKinds, FileFormat
from zephon.named_objects import import_named

__all__ = ["BUILT_IN", "FieldKinds", "FileFormat", "known_formats", "plugin", "register_format",
           "unregister_format"]

BUILT_IN = ("parquet", "jsonl", "arrow", "megatron")


_PLUGINS: dict[str, FileFormat] = {}
_BUNDLED: dict[str, tuple[tuple[str, ...], str]] = {
    "mds": ((".mds", ".mds.zstd", ".mds.gz", ".mds.bz2", ".mds.br", ".mds.snappy"),
            "zephon.io.formats.mds:MDS"),
    "litdata": ((), "zephon.io.formats.litdata:LITDATA"),
}
"""Plug-ins shipped with zephon, by name: their suffixes, and where the FileFormat is
(imported on first use)."""
_BUNDLED_INDEXES = {"index.json": ("litdata",)}
"""Companion names that bundled formats with a ``describe`` hook read (imported when a
listing first meets such a file)."""


def _load_bundled(name: str) -> FileFormat | None:
    if name not in _BUNDLED or name in _PLUGINS:
        return _PLUGINS.get(name)
    fmt = import_named(_BUNDLED[name][1], f"the {name} format")
    _PLUGINS.setdefault(name, fmt)
    _forget_suffixes()
    return _PLUGINS[name]


def register_format(fmt: FileFormat) -> None:
    """Read files of ``fmt`` (replacing a plug-in of the same name)."""
    if not isinstance(fmt, FileFormat):
        raise ConfigError(f"register_format: expected a FileFormat, got {type(fmt).__name__}")
    if fmt.name in BUILT_IN:
        raise ConfigError(f"register_format: {fmt.name!r} is a built-in format")
    _PLUGINS[fmt.name] = fmt
    _forget_suffixes()


def unregister_format(name: str) -> None:
    """Forget a format :func:`register_format` added (a bundled one loads again on use)."""
    _PLUGINS.pop(name, None)
    _forget_suffixes()


def plugin(name: str | None) -> FileFormat | None:
    """The plug-in called ``name``, else None (a built-in or unknown format)."""
    if name is None or name in BUILT_IN:
        return None
    return _PLUGINS.get(name) or _load_bundled(name)


def known_formats() -> tuple[str, ...]:
    """Every format name ``fmt=`` accepts: the built-in ones, then the plug-ins."""
    return BUILT_IN + tuple(dict.fromkeys([*_BUNDLED, *_PLUGINS]))


_SUFFIX_TABLE: list[tuple[tuple[str, ...], list[tuple[str, str]]]] = []
"""The plug-ins' suffixes, made once per change of the registry: all of them (for one
``endswith`` call that most names fail), and ``(suffix, format)`` pairs longest first."""


def _forget_suffixes() -> None:
    _SUFFIX_TABLE.clear()


def _suffixes() -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    if not _SUFFIX_TABLE:
        registered = [(s, f.name) for f in _PLUGINS.values() for s in f.suffixes]
        bundled = [(s, n) for n, (suffixes, _) in _BUNDLED.items() if n not in _PLUGINS
                   for s in suffixes]
        pairs = sorted(registered + bundled, key=lambda p: (len(p[0]), p[1]), reverse=True)
        _SUFFIX_TABLE.append((tuple(s for s, _ in pairs), pairs))
    return _SUFFIX_TABLE[0]


def detect_plugin(name: str) -> str | None:
    """The plug-in whose longest suffix ends ``name`` (of two as long, the later name),
    else None. A listing asks this of every file, so the suffixes are sorted once."""
    lower = name.lower()
    every, pairs = _suffixes()
    if not lower.endswith(every):
        return None
    return next(n for s, n in pairs if lower.endswith(s))


def companion_files(paths_and_formats: list[tuple[str, str]]) -> dict[str, str]:
    """The paths among ``(path, format)`` that are companions (:attr:`FileFormat.companions`)
    of a plug-in format with a file in the same folder, with that format."""
    folders: dict[str, set[str]] = {}
    for path, fmt in paths_and_formats:
        folders.setdefault(path.rpartition("/")[0], set()).add(fmt)
    found = {}
    for path, _ in paths_and_formats:
        folder, _, name = path.rpartition("/")
        for fmt in sorted(folders[folder]):
            registered = plugin(fmt)
            if registered is not None and name in registered.companions:
                found[path] = fmt
    return found


def context_keyword(fmt: FileFormat, context: str | None) -> dict[str, str | None]:
    """The ``context=`` keyword ``fmt``'s hooks take: none unless it has ``describe``."""
    return {"context": context} if fmt.describe is not None else {}


def _describers(name: str) -> list[FileFormat]:
    """The formats whose ``describe`` reads a companion called ``name``."""
    for bundled in _BUNDLED_INDEXES.get(name, ()):
        plugin(bundled)
    return [f for f in _PLUGINS.values() if f.describe is not None and name in f.companions]


def described_files(paths: list[str], read: Callable[[str], bytes],
                    shown: Callable[[str], str] = str,
                    present: set[str] | None = None, fmt: str | None = None
                    ) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """What the indexes among ``paths`` (``"folder/name"`` strings) say:
    ``({path: (format, context)}, {index path: format})``. ``read(path)`` gives a companion's
    bytes; ``shown(path)`` names a path in errors; ``fmt`` (a dataset's ``fmt=``), when set,
    is the only format asked. A file an index names that is not among ``present`` (default:
    ``paths``) is a DataError: the dataset is incomplete."""
    listed = set(paths) if present is None else present
    claimed: dict[str, tuple[str, str]] = {}
    indexes: dict[str, str] = {}
    index_names = tuple({*_BUNDLED_INDEXES, *(c for f in _PLUGINS.values()
                                             if f.describe is not None for c in f.companions)})
    for path in paths:
        if not path.endswith(index_names):  # one C call a file: listings run to 100,000s
            continue
        folder, _, name = path.rpartition("/")
        for describer in _describers(name):
            if fmt is not None and describer.name != fmt:
                continue
            described = describer.describe(read(path), shown(path))
            if described is None:
                continue
            named = {(f"{folder}/{file}" if folder else file): context
                     for file, context in described.items()}
            missing = sorted(set(named) - listed)
            if missing:
                raise DataError(f"{shown(path)} names {len(missing)} {describer.name} file(s) that "
                                f"are not there, e.g. {shown(missing[0])}: the dataset is "
                                "incomplete (or the path selects only part of it)")
            claimed.update((p, (describer.name, context)) for p, context in named.items())
            indexes[path] = describer.name
            break
    return claimed, indexes
