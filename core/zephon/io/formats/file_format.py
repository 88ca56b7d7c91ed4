"""What a file-format plug-in is: :class:`FileFormat` (and :class:`FieldKinds`, what its
``fields`` hook may answer). The registry that finds plug-ins by name and suffix is
:mod:`zephon.io.formats.registry`; plug-ins import this module, never the registry, so that the
registry may name the plug-ins Zephon ships by string (imported when first used) without an
import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError


class FieldKinds(dict):
    """A file's fields and their kinds, as a ``fields`` hook may give them when it could read
    only part of what names them (a JSON line longer than it reads): ``complete`` is False, a
    field absent here may still be in the file, and ``note`` says what was read. A plain dict
    is a complete answer."""

    def __init__(self, kinds: dict[str, str], complete: bool = True, note: str = ""):
        super().__init__(kinds)
        self.complete, self.note = complete, note


@dataclass(frozen=True, slots=True)
class FileFormat:
    """A file-format plug-in; see :mod:`zephon.io.formats.registry`."""

    name: str
    """What ``fmt=`` names it by."""
    suffixes: tuple[str, ...]
    """File-name endings detected as this format (``".toy"``); matched case-insensitively,
    the longest first, before the built-in suffixes."""
    plan: Callable[..., list[Any]]
    """``plan(path, hints, min_units) -> [UnitSpec]``: the file's units, at least
    ``min_units`` where it can (``hints`` holds ``unit_bytes`` and ``arrow_unit_rows``)."""
    read: Callable[..., tuple[dict[str, Any], list[int]]]
    """``read(path, unit, columns, display) -> (columns, keys)``: the unit's rows column-wise
    (``columns=None``: every column; a missing column is a DataError naming ``display``) and
    one int key a row that identifies it inside the file."""
    fields: Callable[[str], dict[str, str]] | None = None
    """``fields(path) -> {field: kind}`` with kinds as ``zephon check`` names them
    (``"text"``, ``"list<int>"``, ``"list"``, ``"null"``); None: not checked before reading."""
    row_label: str = "row"
    """How errors name a row's key (``row``, ``line``, ``sample``)."""
    companions: tuple[str, ...] = ()
    """File names that accompany files of this format (``index.json`` of MDS): a listing
    skips them, as metadata, in a folder that holds files of this format."""
    describe: Callable[[bytes, str], dict[str, str] | None] | None = None
    """``describe(companion_bytes, display) -> {file name: context}``, or None when the
    companion is not this format's index (another format's ``index.json``); see the module
    docstring. With it set, ``plan``, ``read`` and ``fields`` take a ``context=`` keyword."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ConfigError(f"FileFormat: name {self.name!r} must be an identifier")
        bad = [s for s in self.suffixes if not s.startswith(".") or s != s.lower()]
        if bad or not (self.suffixes or self.describe):
            raise ConfigError(f"FileFormat {self.name!r}: suffixes must be lower-case and "
                              f"start with '.', got {self.suffixes!r}")
