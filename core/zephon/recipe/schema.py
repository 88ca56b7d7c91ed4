"""Recipe keys derived from the classes that own them: names, types, defaults, docstrings.

A dataclass field becomes a recipe key unless its metadata says ``recipe=False`` (objects such
as a tokenizer instance have no TOML form). Its docstring is the string literal written right
under it in the class body. Keyword parameters of a constructor (the work source's options)
become keys too, documented in the class docstring under their names. Values read from TOML
are checked against the annotations here, so a wrong type fails when the recipe is read,
naming the file, section and key.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from zephon.errors import ConfigError

_MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class Key:
    """One recipe key."""

    name: str
    hint: Any
    """The Python type annotation its value must satisfy."""
    default: Any
    """The default (``dataclasses.MISSING`` when the key is required)."""
    doc: str
    owner: str
    """The class (or callable) it comes from, for documentation."""

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def __repr__(self) -> str:
        default = "required" if self.required else f"default {self.default!r}"
        return f"<key {self.name}: {describe(self.hint)}, {default}>"

    def __str__(self) -> str:
        default = "required" if self.required else f"default {_toml_value(self.default)}"
        return f"{self.name} ({describe(self.hint)}; {default}): {self.doc or '-'}"


def _toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def format_schema(schema: Mapping[str, Mapping[str, Key]], width: int = 96) -> str:
    """Every section's keys as text: the section header as a recipe writes it, then one
    entry per key with its type, default and docstring, wrapped at ``width``."""
    headers = {"": "top level", "datasets": "[[datasets]]", "ops": "[[ops]] (every entry; "
               "each operator adds its own keys)"}
    lines = []
    for section, keys in schema.items():
        header = headers.get(section) or (
            f"[{section.split('.')[0]}] with kind = \"{section.split('.')[1]}\""
            if "." in section else f"[{section}]")
        lines.append(header)
        for key in keys.values():
            lines += textwrap.wrap(str(key), width, initial_indent="  ",
                                   subsequent_indent="      ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literals under annotated fields in ``cls`` and its
    dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def dataclass_keys(cls: type, exclude: Collection[str] = ()) -> dict[str, Key]:
    """The recipe keys of a dataclass: every field not marked ``recipe=False``."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    keys = {}
    for f in dataclasses.fields(cls):
        if not f.metadata.get("recipe", True) or f.name in exclude:
            continue
        default = f.default if f.default is not _MISSING else (
            f.default_factory() if f.default_factory is not _MISSING else _MISSING)
        keys[f.name] = Key(f.name, hints[f.name], default, docs.get(f.name, ""), cls.__name__)
    return keys


def parameter_keys(target: Callable[..., Any], names: Sequence[str]) -> dict[str, Key]:
    """Recipe keys from keyword parameters of ``target``, documented in its docstring as a
    name on its own line followed by indented text."""
    signature = inspect.signature(target)
    hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    text = inspect.getdoc(target) or ""
    keys = {}
    for name in names:
        parameter = signature.parameters[name]
        found = re.search(rf"^{name}\n((?:[ \t]+.+\n?)+)", text, re.MULTILINE)
        doc = " ".join(found.group(1).split()) if found else ""
        keys[name] = Key(name, hints[name], parameter.default, doc,
                         getattr(target, "__name__", str(target)))
    return keys


def describe(hint: Any) -> str:
    """A type annotation in words a TOML user reads."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None))
    if origin in (tuple, list, Sequence, Collection):
        if not args:
            return "a list"
        item = describe(args[0])
        if item.startswith(("a ", "an ")):
            item = item.split(" ", 1)[1] + "s"
        return f"a list of {item}"
    if origin in (dict, Mapping):
        return "a table"
    if origin is Callable or hint is Callable:
        return "an import path"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def matches(value: Any, hint: Any) -> bool:
    """Whether a TOML value satisfies a type annotation."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list, Sequence, Collection):
        item = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(matches(v, item) for v in value)
    if origin in (dict, Mapping):
        k, v = args if args else (Any, Any)
        return isinstance(value, dict) and all(matches(a, k) and matches(b, v)
                                               for a, b in value.items())
    if origin is Callable or hint is Callable:
        return callable(value)
    return isinstance(value, hint) if isinstance(hint, type) else True


def read_table(table: Any, keys: Mapping[str, Key], source: str, section: str | None = None
               ) -> dict[str, Any]:
    """``table`` checked against ``keys``: unknown keys and wrong types are ConfigErrors that
    name the ``source`` file and the ``section``, and list the known keys."""
    values, problems = read_table_parts(table, keys, source, section)
    if problems:
        raise ConfigError(problems[0])
    return values


def read_table_parts(table: Any, keys: Mapping[str, Key], source: str,
                     section: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The keys of ``table`` that are known and well typed, and one problem for each of the
    others (unknown keys together, then each wrong type), so that one bad key does not hide
    what else a recipe gets wrong."""
    where = f" in [{section}]" if section else ""
    if not isinstance(table, dict):
        return {}, [f"{source}: [{section}] must be a table"]
    problems = []
    unknown = sorted(set(table) - set(keys))
    if unknown:
        problems.append(f"{source}: unknown key(s) {unknown}{where}; known: {sorted(keys)}")
    values = {}
    for name, value in table.items():
        if name not in keys:
            continue
        if matches(value, keys[name].hint):
            values[name] = value
        else:
            problems.append(f"{source}: {name} = {value!r}{where} must be "
                            f"{describe(keys[name].hint)}")
    return values, problems
