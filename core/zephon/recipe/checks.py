"""Preflight: what can fail in a data recipe, found in seconds, before a model is built.

:func:`check_recipe` reads a recipe (collecting every problem of its keys, values and files),
then checks what only the run's values or the data can tell, without tokenizing anything:

- every dataset's files hold the field its tokenizing operator reads, with a usable type
  (text for ``tokenize``, a list or JSON text for ``tokenize_chat``, a list of integers for
  ``pretokenized``), read from one Parquet footer, Arrow schema, JSON Lines first line (its
  first 1 MiB at most: a field that begins later in a longer line is logged as not told) or
  indexed-dataset index per file. Datasets with a ``map`` before tokenization are skipped (the
  function may make the field);
- the tokenizer loads and its vocabulary fits the model's (``vocab_size``);
- the lanes divide by the data-parallel size, ``[pack] max_length`` is ``seq_len + 1`` and
  ``[batch] microbatch_size`` agrees with the framework's;
- Hub datasets resolve to a commit (through the recipe's ``[cache]``);
- a saved plan (``plan = FILE``) still describes the files: each local dataset is listed
  afresh and every file added, missing or changed since the plan was made is named.

Every problem names the recipe file and key, or the data file. Cost: one small read per file
(a footer or a line) and one tokenizer load, most of it importing the tokenizer libraries
(measured: docs/measurements.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.io.formats import file_fields as fields_of
from zephon.io.storage import is_remote
from zephon.loader_options import lanes_problem
from zephon.logs import get_logger
from zephon.ops.base import applies_to
from zephon.ops.pack import MAX_ROW_TOKENS
from zephon.recipe.data_recipe import DataRecipe
from zephon.recipe.parse import RecipeProblems
from zephon.recipe.resolve import FrameworkValues, ResolvedRecipe

log = get_logger(__name__)

MAX_BATCH_TOKENS = 1 << 31
"""The most tokens in one microbatch (8 GiB of int32 ids): far above what one accelerator
trains on, and low enough that a typo fails in the check rather than in an allocation."""

_EXPECTED = {"tokenize": "text", "tokenize_chat": "a conversation (a list of messages)",
             "pretokenized": "a list of integer token ids"}


def check_recipe(recipe: str | os.PathLike[str] | DataRecipe | ResolvedRecipe, *,
                 world_size: int | None = None, seq_len: int | None = None,
                 vocab_size: int | None = None, microbatch_size: int | None = None,
                 flags: Mapping[str, str] | None = None,
                 values: FrameworkValues | None = None) -> list[str]:
    """Every problem found (an empty list when the recipe is ready); see the module doc.
    The run's values fill the recipe's holes (:meth:`DataRecipe.resolve`); a
    :class:`ResolvedRecipe` brings its own, and ``values`` gives them all at once (lanes
    included) in place of the keywords. ``flags`` names the framework's option behind
    each value (``{"microbatch_size": "--training.local_batch_size"}``), so that a conflict
    says which two values disagree."""
    if isinstance(recipe, ResolvedRecipe):
        values = recipe.values
        recipe = recipe.recipe
    elif values is None:
        values = FrameworkValues(seq_len=seq_len, microbatch_size=microbatch_size,
                                 dp_size=world_size, vocab_size=vocab_size,
                                 flags=dict(flags or {}))
    if not isinstance(recipe, DataRecipe):
        try:
            recipe = DataRecipe.from_toml(recipe)
        except RecipeProblems as exc:
            return exc.problems
        except ZephonError as exc:
            return [str(exc)]
    problems: list[str] = []
    src = recipe.source
    problems += _check_fields(recipe)
    problems += _check_tokenizer(recipe, values.vocab_size)
    lanes = recipe.lanes if recipe.lanes is not None else values.lanes
    rows = recipe.batch.microbatch_size or values.microbatch_size
    row_tokens = (recipe.pack.max_length if recipe.pack is not None else None) or (
        values.seq_len + 1 if values.seq_len is not None else None)
    unbuildable = []
    try:
        resolved = recipe.resolve(values)
        lanes, row_tokens, rows = resolved.lanes, resolved.max_length, resolved.microbatch_size
    except RecipeProblems as exc:
        problems += exc.problems
    except ZephonError as exc:  # a spec refusing the framework's values
        unbuildable.append(f"{src}: {exc}")
    world = values.dp_size
    shared = lanes_problem(lanes, world) if world is not None and lanes is not None else None
    if shared:
        problems.append(f"{src}: lanes = {lanes}: {shared}")
    problems += _size_problems(src, row_tokens, rows) or unbuildable
    problems += _check_hub(recipe)
    problems += _check_plan(recipe)
    return problems


def _check_plan(recipe: DataRecipe) -> list[str]:
    """Files added, missing or changed under a local dataset's path since the recipe's saved
    plan was made (a full listing of each, not the plan's)."""
    if recipe.plan is None:
        return []
    from zephon.io.dataset import Dataset
    from zephon.work.plan_file import plan_changes

    plan = _read_before(recipe.saved_plan)
    if plan is None:
        return []
    problems = []
    for entry in recipe.datasets:
        if is_remote(entry.path):
            continue
        fresh = Dataset.from_path(entry.name, entry.path, entry.fmt)
        try:
            listed = fresh.files()
        except ZephonError as exc:
            problems.append(f"{recipe.source}: dataset {entry.name!r}: {exc}")
            continue
        problems += [f"{recipe.source}: dataset {entry.name!r}: plan {recipe.plan}: {change}"
                     for change in plan_changes(plan, fresh, listed)]
    return problems


def _read_before(read: Any) -> Any:
    """``read()``, or None where it fails: the recipe's reading reported that already."""
    try:
        return read()
    except ZephonError:
        return None


def _size_problems(src: str, row_tokens: int | None, rows: int | None) -> list[str]:
    """Rows longer than zephon packs, or microbatches larger than it batches, from the
    framework's values (the recipe's own are checked when it is read)."""
    problems = []
    if row_tokens is not None and row_tokens > MAX_ROW_TOKENS:
        problems.append(f"{src}: rows of {row_tokens} tokens (the sequence length + 1) are "
                        f"longer than {MAX_ROW_TOKENS}, the longest row zephon packs")
    if rows is not None and row_tokens is not None and rows * row_tokens > MAX_BATCH_TOKENS:
        problems.append(f"{src}: a microbatch of {rows} rows x {row_tokens} tokens is "
                        f"{rows * row_tokens} tokens, more than {MAX_BATCH_TOKENS} "
                        f"({MAX_BATCH_TOKENS * 4 >> 30} GiB of int32 ids); lower the "
                        "microbatch size")
    return problems


def _check_fields(recipe: DataRecipe) -> list[str]:
    before = recipe.ops
    tokenizers = _read_before(recipe.tokenize_specs)
    if tokenizers is None:
        return []
    problems = []
    for entry in recipe.datasets:
        if is_remote(entry.path) or any(applies_to(s, entry.name) for s in before):
            continue
        spec = next((s for s in tokenizers if applies_to(s, entry.name)), None)
        if spec is None:
            continue
        try:
            files = recipe.dataset(entry).files()
        except ZephonError:
            continue  # reported when the recipe was read
        for data_file in files:
            problem = _field_problem(data_file.path, data_file.fmt, data_file.compression,
                                     spec.field, spec.op_name, data_file.context)
            if problem:
                problems.append(f"{recipe.source}: dataset {entry.name!r}: {problem}")
    return problems


def _field_problem(path: str, fmt: str, compression: str | None, field: str,
                   op: str, context: str | None = None) -> str | None:
    """What is wrong with ``field`` in one file for operator ``op`` (None: nothing). A file
    whose fields could be read only in part (a first JSON line longer than zephon check
    reads) and lacks ``field`` in that part is logged as not told, not as a problem."""
    try:
        kinds = fields_of(path, fmt, compression, context)
    except (OSError, ValueError, pa.ArrowException) as exc:
        return f"{path}: cannot be read ({exc})"
    if kinds is None:
        return None
    kind = kinds.get(field)
    if kind is None:
        fields = ", ".join(repr(name) for name in list(kinds)[:20])
        if not getattr(kinds, "complete", True):
            log.warning("%s: could not tell whether it has the field %r (the %s operator "
                        "reads it): %s, and the fields that begin there are %s", path, field,
                        op, kinds.note, fields or "none")
            return None
        return (f"{path}: has no field {field!r} (the {op} operator reads it); its fields: "
                f"{fields or 'none'}. Set the dataset's field = <one of them>, or [tokenize] "
                "field for every dataset")
    ok = {"tokenize": kind in ("text", "null"),
          "tokenize_chat": kind in ("list", "text", "null"),
          "pretokenized": kind in ("list<int>", "null")}.get(op, True)
    if not ok:
        return (f"{path}: field {field!r} holds {kind}, but {op} needs "
                f"{_EXPECTED.get(op, 'another type')}")
    return None


def file_fields(path: str, fmt: str, compression: str | None,
                context: str | None = None) -> list[str]:
    """The field names of a file: its schema's, its first JSON line's keys, or its format's
    index's (``context``)."""
    return list(fields_of(path, fmt, compression, context) or {})


def peek_field(path: str, fmt: str, compression: str | None, field: str,
               context: str | None = None) -> str | None:
    """The kind of ``field`` in a file from its schema or first line: ``"text"``,
    ``"list<int>"``, ``"list"``, ``"null"``, another type's name, ``"empty"`` (no rows to
    tell), ``"unknown"`` (absent from the part of a long first line that was read), or None
    when the field is absent."""
    kinds = fields_of(path, fmt, compression, context)
    if kinds is None:
        return "empty"
    kind = kinds.get(field)
    return "unknown" if kind is None and not getattr(kinds, "complete", True) else kind


def _check_tokenizer(recipe: DataRecipe, vocab_size: int | None) -> list[str]:
    name = recipe.tokenizer
    if name is None:
        limit = recipe.tokenize.get("vocab_size")
        if vocab_size is not None and limit is not None and limit > vocab_size:
            return [f"{recipe.source}: [tokenize] vocab_size = {limit} is larger than the "
                    f"model's vocabulary ({vocab_size})"]
        return []
    from zephon.text.tokenizer import load_tokenizer

    try:
        size = len(load_tokenizer(name))
    except (ZephonError, OSError, ValueError) as exc:
        return [f"{recipe.source}: [tokenize] tokenizer {name!r} does not load: {exc}"]
    if vocab_size is not None and size > vocab_size:
        return [f"{recipe.source}: [tokenize] tokenizer {name!r} has {size} tokens but the "
                f"model's vocabulary has {vocab_size}: token ids past {vocab_size - 1} would "
                "index outside the embedding; size the model to the tokenizer"]
    return []


def _check_hub(recipe: DataRecipe) -> list[str]:
    hub = [e for e in recipe.datasets if is_remote(e.path)]
    if not hub:
        return []
    if recipe.cache is None:
        return [f"{recipe.source}: datasets {[e.name for e in hub]} are remote (hf://, or an "
                "object store) and need a [cache] section (root = <local directory>, "
                "limit_bytes = ...)"]
    from zephon.io import Dataset, StoreOptions

    options = StoreOptions(cache=recipe.cache)
    problems = []
    for entry in hub:
        try:
            dataset = Dataset.from_path(entry.name, entry.path, entry.fmt).bound(options)
            dataset.files()
            problems += _peek_remote(recipe, entry, dataset)
        except ZephonError as exc:
            problems.append(f"{recipe.source}: dataset {entry.name!r} ({entry.path}): {exc}")
    return problems


PEEKED_OBJECTS = 8
"""Remote files whose fields ``zephon check`` peeks, per dataset (a footer or the first
64 KiB each, never a whole file); local datasets are peeked file by file."""


def _peek_remote(recipe: DataRecipe, entry: Any, dataset: Any) -> list[str]:
    """Field problems of the first :data:`PEEKED_OBJECTS` files of a remote dataset that
    can be peeked without downloading them (object stores)."""
    if not hasattr(dataset, "peek_file") or any(applies_to(s, entry.name) for s in recipe.ops):
        return []
    spec = next((s for s in recipe.tokenize_specs() if applies_to(s, entry.name)), None)
    if spec is None:
        return []
    problems = []
    for data_file in dataset.files()[:PEEKED_OBJECTS]:
        if data_file.context is not None:  # its format's index says what it holds
            problem = _field_problem(dataset.display_name(data_file), data_file.fmt,
                                     data_file.compression, spec.field, spec.op_name,
                                     data_file.context)
            if problem:
                problems.append(f"{recipe.source}: dataset {entry.name!r}: {problem}")
            continue
        with dataset.peek_file(data_file) as local:
            if local is None:
                continue
            problem = _field_problem(local, data_file.fmt, data_file.compression, spec.field,
                                     spec.op_name)
        if problem:
            shown = dataset.display_name(data_file)
            problems.append(f"{recipe.source}: dataset {entry.name!r}: "
                            f"{problem.replace(local, shown)}")
    return problems


def describe(path: str | os.PathLike[str] | DataRecipe) -> str:
    """A one-line summary of a recipe that passed: datasets, files, tokenizer, lanes."""
    recipe = path if isinstance(path, DataRecipe) else DataRecipe.from_toml(path)
    files = 0
    for entry in recipe.datasets:
        if not is_remote(entry.path):
            with contextlib.suppress(ConfigError, DataError):
                files += len(recipe.dataset(entry).files())
    tokenizer = Path(recipe.tokenizer).name if recipe.tokenizer else "token ids"
    return (f"{len(recipe.datasets)} dataset(s), {files} local file(s), tokenizer {tokenizer}, "
            f"lanes {recipe.lanes if recipe.lanes is not None else 'unset'}")


def check_or_raise(recipe: str | os.PathLike[str] | DataRecipe, **run: Any) -> None:
    """:func:`check_recipe`, raising :class:`RecipeProblems` with every problem found."""
    problems = check_recipe(recipe, **run)
    if problems:
        source = recipe.source if isinstance(recipe, DataRecipe) else str(recipe)
        raise RecipeProblems(source, problems)
