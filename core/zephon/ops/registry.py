"""Operators by name: the built-in ones (registered as their modules are imported here) and
``"package.module:SpecClass"`` for operators defined elsewhere; what recipes' ``[[ops]]`` and
``op = ...`` keys name."""

from __future__ import annotations

import zephon.ops.batch
import zephon.ops.filter
import zephon.ops.map
import zephon.ops.pack
import zephon.ops.pretokenized
import zephon.ops.shuffle
import zephon.ops.tokenize
import zephon.ops.tokenize_chat  # noqa: F401 - the imports above register the built-ins
from zephon.errors import ConfigError
from zephon.named_objects import import_named
from zephon.ops.base import OPERATORS, OperatorSpec


def operator_spec_class(name: str) -> type[OperatorSpec]:
    """The spec class registered as ``name``, or imported from ``"package.module:Class"``."""
    if ":" not in name:
        if name not in OPERATORS:
            raise ConfigError(f"unknown operator {name!r}; known: {sorted(OPERATORS)} (or "
                              "'package.module:SpecClass')")
        return OPERATORS.get(name)
    target = import_named(name, "operator")
    if not (isinstance(target, type) and issubclass(target, OperatorSpec)):
        raise ConfigError(f"{name!r} is not an operator spec (a zephon.ops.base.OperatorSpec)")
    return target
