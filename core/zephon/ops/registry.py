"""Operators by name: the built-in ones (registered as their modules are imported here) and
``"package.module:SpecClass"`` for operators defined elsewhere; what recipes' ``[[ops]]`` and
``op = ...`` keys name."""

from __future__ import annotations

import importlib

import zephon.ops.batch
import zephon.ops.filter
import zephon.ops.map
import zephon.ops.pack
import zephon.ops.pretokenized
import zephon.ops.shuffle
import zephon.ops.tokenize
import zephon.ops.tokenize_chat  # noqa: F401 - the imports above register the built-ins
from zephon.errors import ConfigError
from zephon.ops.base import _REGISTRY, OperatorSpec


def operator_spec_class(name: str) -> type[OperatorSpec]:
    """The spec class registered as ``name``, or imported from ``"package.module:Class"``."""
    if ":" not in name:
        if name not in _REGISTRY:
            raise ConfigError(f"unknown operator {name!r}; known: {sorted(_REGISTRY)} (or "
                              "'package.module:SpecClass')")
        return _REGISTRY[name]
    module_name, _, attr = name.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import operator {name!r}: {exc}") from None
    if not (isinstance(target, type) and issubclass(target, OperatorSpec)):
        raise ConfigError(f"{name!r} is not an operator spec (a zephon.ops.base.OperatorSpec)")
    return target
