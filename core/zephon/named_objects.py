"""Objects named by ``"package.module:attribute"`` strings, and registries that hold such names.

Recipes, registries and plug-ins name code by string: an operator's spec class
(``op = "my_pkg.ops:Dedup"``), a ``map``/``filter`` function, a storage scheme's bucket
opener, a remote dataset class, a bundled file format. One function imports them all
(:func:`import_named`), with one error for every way a name can fail (no such module, no such
attribute), and one registry (:class:`Registry`) holds entries that are either the object or
its name, imported on first use and kept. Naming by string lets a registry list an entry
without importing its dependencies: the Hub dataset class costs about 1 s of
``huggingface_hub`` imports, and a path that never says ``hf://`` never pays it.

``"package.module.attribute"`` (a dot instead of the colon) is read as the last dot's split,
for functions named the way Python prints them; a nested attribute (``"module:Class.method"``)
is followed part by part.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from zephon.errors import ConfigError

T = TypeVar("T")


class MissingModule(ConfigError):
    """The module a name points into is not installed; ``module`` is the missing one (which
    may be a dependency of the named module)."""

    def __init__(self, message: str, module: str | None):
        super().__init__(message)
        self.module = module


def split_name(ref: str, what: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``"package.module:attribute"`` (or its dotted form)."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"{what} must be 'package.module:name', got {ref!r}")
    module, sep, attribute = ref.partition(":")
    if not sep:
        module, _, attribute = ref.rpartition(".")
    if not module or not attribute:
        raise ConfigError(f"{what}: {ref!r} is not 'package.module:name'")
    return module, attribute


def import_named(ref: str, what: str) -> Any:
    """The object ``ref`` names, imported now. ``what`` says what it is for in errors (``"fn
    of map"``): a module that cannot be imported (:class:`MissingModule` when it is not
    installed) or an attribute it lacks is a ConfigError naming ``ref``."""
    module_name, attribute = split_name(ref, what)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise MissingModule(f"{what}: cannot import module {module_name!r} for {ref!r}: "
                            f"{exc}", exc.name) from None
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import module {module_name!r} for {ref!r}: "
                          f"{exc}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{what}: module {module_name!r} has no {attribute!r} ({ref!r})")
        target = getattr(target, part)
    return target


class Registry(Generic[T]):
    """Entries by name, each an object or the :func:`import_named` string of one (imported
    when first asked for, then kept). ``what`` names the registry's kind in errors."""

    def __init__(self, what: str, entries: dict[str, T | str] | None = None):
        self.what = what
        self._entries: dict[str, T | str] = dict(entries or {})

    def register(self, name: str, entry: T | str) -> None:
        """Add ``entry`` as ``name``, replacing an earlier one."""
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Forget ``name`` (nothing if it is not registered)."""
        self._entries.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def is_loaded(self, name: str) -> bool:
        """Whether ``name``'s object is imported (a string entry is not, until asked for)."""
        return name in self._entries and not isinstance(self._entries[name], str)

    def entry(self, name: str) -> T | str:
        """What was registered as ``name``, as given (no import)."""
        return self._entries[name]

    def get(self, name: str) -> T:
        """The object registered as ``name``, imported if it was given by name; an unknown
        name is a ConfigError listing the known ones."""
        if name not in self._entries:
            raise ConfigError(f"unknown {self.what} {name!r}; known: {sorted(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_named(entry, f"{self.what} {name!r}")
            self._entries[name] = entry
        return entry
