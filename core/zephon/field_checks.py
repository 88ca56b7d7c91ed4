"""Checks for values read back: nothing in a loader state or in a data file's index is trusted.

A node's ``restore`` takes plain data that may come from a damaged or edited checkpoint, and a
reader of a peer format takes an index or a header written by another program (LitData's
``index.json``, an MDS shard's column config). The helpers here check one field each (its
type and range) and return it, or raise
:class:`StateFieldError` with the field's path inside the part being checked (``position[1]``)
and what is wrong (``is -5, must be >= 0``). Whoever restores an enclosing part adds its own
path (:func:`within`), so the loader reports ``nodes[0].sources[1].position[1] is -5, must be
>= 0`` under the state key of the lane. A reader reports them as errors of its own kind
naming its file (:func:`reported_as`: a DataError ``index.json: chunks[2].chunk_size is 0,
must be >= 1``). The checks are per field and per array, never per token, so restoring a
lane that holds 64 packed rows of 2049 tokens (about 500 documents) with them costs less than
decoding its arrays (measured: docs/measurements.md).

Counts and positions must be integers (never booleans, floats or strings) from 0 to
:data:`MAX_COUNT`; token arrays must be one-dimensional integer arrays of ids from 0 to below
the vocabulary of the pipeline restoring the state (:func:`token_limit`; two reductions an
array), so an edited id cannot reach the trainer's embedding.
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from zephon.errors import StateMismatchError
from zephon.records import Doc, DocSpan, Record

MAX_COUNT = 2**63 - 1
"""The largest count or position a state may hold (what int64 holds; no run gets near it)."""
ID_LIMIT = 2**31
"""Token ids are int32: without a known vocabulary, every id must lie below this."""

_ID_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("id_limit", default=ID_LIMIT)


@contextmanager
def token_limit(limit: int | None) -> Iterator[None]:
    """Within the block, token arrays of a state must hold ids below ``limit`` (None:
    below :data:`ID_LIMIT`)."""
    reset = _ID_LIMIT.set(ID_LIMIT if limit is None else min(limit, ID_LIMIT))
    try:
        yield
    finally:
        _ID_LIMIT.reset(reset)


class StateFieldError(StateMismatchError):
    """A field of a state is missing, of the wrong type or out of range. ``path`` locates it
    inside the part being checked; :meth:`within` adds the path of an enclosing part."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path} {problem}" if path else problem)
        self.path, self.problem = path, problem

    def within(self, prefix: str) -> StateFieldError:
        return StateFieldError(join(prefix, self.path), self.problem)


def join(prefix: str, path: str) -> str:
    """``prefix`` then ``path``: ``a`` + ``b`` is ``a.b``, ``a`` + ``[1]`` is ``a[1]``."""
    if not prefix or not path:
        return prefix or path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def item(path: str, index: int) -> str:
    return f"{path}[{index}]"


@contextmanager
def within(prefix: str) -> Iterator[None]:
    """Report the fields that the enclosed checks refuse under ``prefix``."""
    try:
        yield
    except StateFieldError as exc:
        raise exc.within(prefix) from None


@contextmanager
def reported_as(error: type[Exception], where: str) -> Iterator[None]:
    """Report the fields the enclosed checks refuse as ``error`` (a DataError, for a file
    read back) with ``where`` (the file) before the field's path and problem."""
    try:
        yield
    except StateFieldError as exc:
        raise error(f"{where}: {exc}") from None


def describe(value: Any) -> str:
    """``value`` as a message shows it: its repr, shortened, and its type where repr hides it."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if value is None or isinstance(value, (bool, int, float)):
        return text
    return f"{text} ({type(value).__name__})"


# -- one field -----------------------------------------------------------------------------
def need_dict(value: Any, path: str) -> dict[str, Any]:
    """``value`` as a dict with string keys."""
    if not isinstance(value, dict):
        raise StateFieldError(path, f"is {describe(value)}, must be a dict")
    for key in value:
        if not isinstance(key, str):
            raise StateFieldError(path, f"has the key {describe(key)}; keys are strings")
    return value


def need_fields(value: Any, path: str, fields: Collection[str],
                optional: Collection[str] = ()) -> dict[str, Any]:
    """``value`` as a dict holding every one of ``fields``, some of ``optional``, no other."""
    value = need_dict(value, path)
    for name in fields:
        if name not in value:
            raise StateFieldError(join(path, name), "is missing")
    for name in value:
        if name not in fields and name not in optional:
            raise StateFieldError(join(path, name), "is not a field of this state")
    return value


def need_int(value: Any, path: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """``value`` as an int from ``low`` to ``high``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise StateFieldError(path, f"is {describe(value)}, must be an integer")
    if value < low:
        raise StateFieldError(path, f"is {value}, must be >= {low}")
    if value > high:
        raise StateFieldError(path, f"is {value}, must be <= {high}")
    return int(value)


def need_bool(value: Any, path: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise StateFieldError(path, f"is {describe(value)}, must be true or false")
    return bool(value)


def need_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise StateFieldError(path, f"is {describe(value)}, must be a string")
    return value


def need_list(value: Any, path: str, length: int | None = None) -> list[Any]:
    """``value`` as a list (of ``length`` items when given)."""
    if not isinstance(value, list):
        raise StateFieldError(path, f"is {describe(value)}, must be a list")
    if length is not None and len(value) != length:
        raise StateFieldError(path, f"has {len(value)} item(s), must have {length}")
    return value


def need_counts(value: Any, path: str, names: Collection[str] | None = None) -> dict[str, int]:
    """``value`` as counts by name (exactly ``names`` when given)."""
    value = need_dict(value, path) if names is None else need_fields(value, path, names)
    return {name: need_int(count, join(path, name)) for name, count in value.items()}


def need_array(value: Any, path: str, kinds: str = "iu", length: int | None = None
               ) -> np.ndarray:
    """``value`` as a one-dimensional numpy array whose dtype kind is one of ``kinds``
    (``"iu"``: integers, ``"b"``: booleans), of ``length`` items when given."""
    names = {"iu": "integer", "b": "boolean"}
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in kinds:
        shown = (f"an array of shape {value.shape} and dtype {value.dtype}"
                 if isinstance(value, np.ndarray) else describe(value))
        raise StateFieldError(path, f"is {shown}, must be a 1-D {names.get(kinds, kinds)} "
                                    "array")
    if length is not None and len(value) != length:
        raise StateFieldError(path, f"holds {len(value)} item(s), must hold {length}")
    return value


def need_ids(value: Any, path: str, length: int | None = None) -> np.ndarray:
    """``value`` as a one-dimensional integer array of token ids: each from 0 to below the
    current :func:`token_limit`."""
    ids = need_array(value, path, length=length)
    if ids.size:
        low, high, limit = int(ids.min()), int(ids.max()), _ID_LIMIT.get()
        if low < 0:
            raise StateFieldError(path, f"holds the token id {low}; ids are >= 0")
        if high >= limit:
            raise StateFieldError(path, f"holds the token id {high}, but the vocabulary has "
                                        f"{limit} ids (0 to {limit - 1})")
    return ids


# -- documents and records -----------------------------------------------------------------
def doc_from_state(value: Any, path: str) -> Doc:
    """A tokenized :class:`Doc` (a piece held in an open row) from ``Doc.to_plain`` data."""
    parts = need_list(value, path, 6)
    tokens = need_ids(parts[0], item(path, 0))
    mask = None if parts[4] is None else need_array(parts[4], item(path, 4), "b", len(tokens))
    fields = None if parts[5] is None else need_dict(parts[5], item(path, 5))
    return Doc(tokens, need_str(parts[1], item(path, 1)), need_str(parts[2], item(path, 2)),
               need_int(parts[3], item(path, 3)), mask, fields)


def span_from_state(value: Any, path: str) -> DocSpan:
    if (type(value) is list and len(value) == 5 and type(value[0]) is str
            and type(value[1]) is str
            and all(type(n) is int and 0 <= n <= MAX_COUNT for n in value[2:])):
        return DocSpan(*value)  # the common case, without a path per field
    parts = need_list(value, path, 5)
    return DocSpan(need_str(parts[0], item(path, 0)), need_str(parts[1], item(path, 1)),
                   *(need_int(parts[i], item(path, i)) for i in (2, 3, 4)))


def record_from_state(value: Any, path: str) -> Record:
    """A :class:`Record` from ``Record.to_plain`` data, refused when it is malformed.

    Every record needs a string ``meta.id``. A record with ``meta.documents`` carries tokens:
    flat rows an integer ``input_ids`` that holds every span (and ``positions`` and
    ``train_mask`` of the same length, when present), rows of ``pack_sequences`` one integer
    array per span of exactly its length. Other payloads are the row's own data and pass."""
    state = need_fields(value, path, ("payload", "meta"))
    payload = need_dict(state["payload"], join(path, "payload"))
    meta_path = join(path, "meta")
    meta = dict(need_dict(state["meta"], meta_path))
    if "id" not in meta:
        raise StateFieldError(join(meta_path, "id"), "is missing")
    need_str(meta["id"], join(meta_path, "id"))
    for name, check in (("lane", need_int), ("padding", need_int), ("dataset", need_str),
                        ("packed_sequences", need_bool)):
        if name in meta:
            check(meta[name], join(meta_path, name))
    if "documents" in meta:
        spans_path = join(meta_path, "documents")
        meta["documents"] = tuple(span_from_state(s, item(spans_path, i))
                                  for i, s in enumerate(need_list(meta["documents"], spans_path)))
        _check_token_payload(payload, meta, join(path, "payload"), spans_path)
    return Record(dict(payload), meta)


def _check_token_payload(payload: dict[str, Any], meta: dict[str, Any], path: str,
                         spans_path: str) -> None:
    spans: tuple[DocSpan, ...] = meta["documents"]
    if meta.get("packed_sequences"):
        docs_path = join(path, "documents")
        docs = need_list(_get(payload, "documents", path), docs_path, len(spans))
        for i, (tokens, span) in enumerate(zip(docs, spans, strict=True)):
            need_ids(tokens, item(docs_path, i), length=span.length)
        if "train_masks" in payload:
            masks_path = join(path, "train_masks")
            masks = need_list(payload["train_masks"], masks_path, len(spans))
            for i, (mask, span) in enumerate(zip(masks, spans, strict=True)):
                need_array(mask, item(masks_path, i), "b", span.length)
        return
    ids = need_ids(_get(payload, "input_ids", path), join(path, "input_ids"))
    if "positions" in payload:
        need_array(payload["positions"], join(path, "positions"), length=len(ids))
    if "train_mask" in payload:
        need_array(payload["train_mask"], join(path, "train_mask"), "b", len(ids))
    for i, span in enumerate(spans):
        if span.row_start + span.length > len(ids):
            end = span.row_start + span.length
            raise StateFieldError(item(spans_path, i), f"is tokens {span.row_start}..{end} "
                                                       f"of a row of {len(ids)}")


def _get(fields: dict[str, Any], name: str, path: str) -> Any:
    if name not in fields:
        raise StateFieldError(join(path, name), "is missing")
    return fields[name]
