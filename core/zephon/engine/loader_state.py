"""Loader state: per-lane entries with a fingerprint, and how mismatches are explained.

``Pipeline.state_dict()`` returns ``{"lane_<l>": entry}`` for the lanes a rank owns. An entry
holds the lane's snapshot after its last *consumed* microbatch (every node's snapshot, in chain
order), the number of global microbatches the run had consumed when the state was taken, and
the fingerprint of everything that must not change across a resume. Keys are lane-unique, so
checkpoints written by any number of ranks can be merged and loaded at any data-parallel size
that divides the lane count.

Entries are portable plain data: dicts with string keys, lists, strings, numbers, booleans and
None. Token arrays are stored as ``{"__ndarray__": [dtype, shape, base64 bytes]}`` (4 bytes of
text per 3 bytes of array, no Python object per token), so a state survives ``json.dumps``,
``torch.load(weights_only=True)`` and any pickle-free checkpointer, and never depends on the
names or layout of Zephon's classes. ``STATE_VERSION`` changes when the meaning of entries does.

Each entry is a sealed artifact (:mod:`zephon.artifacts`): it names its kind and carries the
SHA-256 of its content, and :func:`lane_entries` refuses one that was changed or damaged
before it checks each field. Token ids held in a state (open packed rows, shuffle buffers)
are checked against the vocabulary of the pipeline restoring it
(:func:`zephon.field_checks.token_limit`).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from zephon.artifacts import opened, sealed
from zephon.errors import StateMismatchError
from zephon.field_checks import (
    StateFieldError,
    item,
    join,
    need_bool,
    need_counts,
    need_dict,
    need_fields,
    need_int,
    need_list,
    need_str,
)

STATE_VERSION = 4
"""4 added ``tail_from`` (the last round, :mod:`zephon.engine.last_round`); an entry of
version 3 is read as one with ``tail_from`` None, which is what it meant."""
ENTRY_KIND = "zephon.loader-state-lane"
"""The artifact kind of a lane entry."""
_ARRAY = "__ndarray__"


def to_portable(value: Any) -> Any:
    """``value`` with numpy arrays encoded and tuples as lists (see the module docstring)."""
    if isinstance(value, np.ndarray):
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
        return {_ARRAY: [value.dtype.str, list(value.shape), data]}
    if isinstance(value, dict):
        return {key: to_portable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_portable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def from_portable(value: Any, path: str = "") -> Any:
    """The inverse of :func:`to_portable` (tuples come back as lists). An encoded array that
    is malformed raises :class:`StateFieldError` at its path below ``path``: a dtype that is
    not a number or boolean, a shape that is not a list of counts, text that is not base64,
    or bytes that do not fill the shape exactly."""
    if isinstance(value, dict):
        if len(value) == 1 and _ARRAY in value:
            return _decode_array(value[_ARRAY], join(path, _ARRAY))
        return {key: from_portable(part, join(path, str(key))) for key, part in value.items()}
    if isinstance(value, list):
        return [from_portable(part, item(path, i)) for i, part in enumerate(value)]
    return value


def _decode_array(encoded: Any, path: str) -> np.ndarray:
    dtype_text, shape, data = need_list(encoded, path, 3)
    name = need_str(dtype_text, item(path, 0))
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise StateFieldError(item(path, 0), f"is {name!r}, not a numpy dtype") from None
    if dtype.kind not in "biuf":
        raise StateFieldError(item(path, 0), f"is {name!r}; arrays in a loader state hold "
                                             "numbers or booleans")
    shape_path = item(path, 1)
    dims = [need_int(n, item(shape_path, i)) for i, n in enumerate(need_list(shape, shape_path))]
    try:
        raw = base64.b64decode(need_str(data, item(path, 2)), validate=True)
    except (binascii.Error, ValueError):
        raise StateFieldError(item(path, 2), "is not base64 text") from None
    size = math.prod(dims) * dtype.itemsize
    if len(raw) != size:
        raise StateFieldError(item(path, 2), f"holds {len(raw)} bytes, but an array of shape "
                                             f"{dims} and dtype {dtype} has {size}")
    return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def lane_key(lane: int) -> str:
    return f"lane_{lane}"


# -- checking entries ------------------------------------------------------------------------
ENTRY_FIELDS = ("version", "lane", "fingerprint", "consumed_global", "finished", "leftover",
                "start_step", "earlier_microbatches", "dp_world_size", "tail_from",
                "lane_state")
LEFTOVER_FIELDS = ("microbatches", "rows", "documents", "tokens")
_LANE_KEY = re.compile(r"lane_(0|[1-9][0-9]*)")


@contextmanager
def in_entry(key: str) -> Iterator[None]:
    """Report the fields the enclosed checks refuse as fields of the entry ``key``."""
    try:
        yield
    except StateFieldError as exc:
        where = f"loader state {key!r}"
        raise StateMismatchError(f"{where}: {exc}" if exc.path else f"{where} {exc}") from None


def lane_entries(state: Any) -> dict[int, dict[str, Any]]:
    """The entries of ``state`` by lane. Every key must be ``lane_<n>`` and every entry a
    dict of exactly :data:`ENTRY_FIELDS` at :data:`STATE_VERSION`, with typed fields: counts,
    a ``finished`` flag, ``leftover`` counts or None, and a dict fingerprint whose Hub
    commits are strings. ``lane_state`` is left to the lane that restores it, and whether
    the fingerprint and ``lane`` fit the pipeline to :func:`check_fingerprint` and
    :func:`check_lanes`."""
    if not isinstance(state, dict):
        raise StateMismatchError(f"load_state_dict expects a dict, got {type(state).__name__}")
    entries = {}
    for key, entry in state.items():
        found = _LANE_KEY.fullmatch(key) if isinstance(key, str) else None
        if found is None:
            raise StateMismatchError(
                f"loader state has the key {key!r}, which is not a lane entry (lane_<n>): "
                "load the dict that state_dict() returned, merged over the ranks")
        entries[int(found.group(1))] = opened(entry, ENTRY_KIND, f"loader state {key!r}",
                                              _check_entry)
    if not entries:
        raise StateMismatchError("loader state has no lane entries (keys lane_<n>); was it "
                                 "written by a zephon Pipeline?")
    return entries


def sealed_entry(fields: dict[str, Any]) -> dict[str, Any]:
    """A lane entry of ``fields`` (:data:`ENTRY_FIELDS`), sealed."""
    return sealed(ENTRY_KIND, fields)


def _check_entry(entry: Any) -> dict[str, Any]:
    entry = need_dict(entry, "")
    version = entry.get("version")
    if type(version) is int and version == 3 and "tail_from" not in entry:
        entry = {**entry, "version": STATE_VERSION, "tail_from": None}
    elif type(version) is not int or version != STATE_VERSION:
        raise StateFieldError("", f"has version {version!r}, expected {STATE_VERSION}")
    need_fields(entry, "", ENTRY_FIELDS)
    if entry["tail_from"] is not None:
        need_int(entry["tail_from"], "tail_from")
    need_int(entry["lane"], "lane")
    need_int(entry["consumed_global"], "consumed_global")
    need_int(entry["start_step"], "start_step")
    need_int(entry["earlier_microbatches"], "earlier_microbatches")
    need_int(entry["dp_world_size"], "dp_world_size", low=1)
    need_bool(entry["finished"], "finished")
    if entry["leftover"] is not None:
        need_counts(entry["leftover"], "leftover", LEFTOVER_FIELDS)
    fingerprint = need_dict(entry["fingerprint"], "fingerprint")
    # What a resume reads before comparing fingerprints: the Hub commits, to follow a branch
    # that moved (the rest is compared as a whole by check_fingerprint).
    if "work_source" in fingerprint:
        work = need_dict(fingerprint["work_source"], "fingerprint.work_source")
        if "datasets" in work:
            path = "fingerprint.work_source.datasets"
            for name, dataset in need_dict(work["datasets"], path).items():
                if isinstance(dataset, dict) and "commit" in dataset:
                    need_str(dataset["commit"], join(path, f"{name}.commit"))
                    if dataset.get("source") is not None:
                        need_str(dataset["source"], join(path, f"{name}.source"))
    return entry


def check_lanes(entries: dict[int, dict[str, Any]], lanes: int) -> None:
    """Refuse entries of lanes the pipeline does not have, and entries filed under another
    lane's key (two lanes' entries swapped)."""
    for lane, entry in entries.items():
        key = lane_key(lane)
        if lane >= lanes:
            raise StateMismatchError(f"loader state has an entry {key!r}, but this pipeline "
                                     f"has lanes 0 to {lanes - 1}")
        if entry["lane"] != lane:
            raise StateMismatchError(
                f"loader state {key!r}: lane is {entry['lane']}, but the entry is filed under "
                f"{key!r}: the entries of different lanes were swapped or renamed")


FINGERPRINT_PARTS = {
    "lanes": "the lane count",
    "work_source.datasets": "the datasets or their files",
    "work_source.mixture": "the mixture weights",
    "work_source.seed": "the seed",
    "work_source": "the work source options",
    "ops": "the operators",
    "work_units": "the work units cut from the files",
    "version": "the zephon version",
}
"""What each part of a fingerprint is, to a user, by the first prefix of its path."""
_RESUME_HINTS = {"work_source.datasets": "another revision?"}
"""Likely causes of a part that changed between a checkpoint and a resume."""


def first_difference(saved: Any, current: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first path at which two fingerprints differ, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in current:
                return sub, saved.get(key), current.get(key)
            found = first_difference(saved[key], current[key], sub)
            if found:
                return found
        return None
    if (isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple))
            and len(saved) == len(current)):
        for i, (a, b) in enumerate(zip(saved, current, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if saved == current else (path, saved, current)


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], key: str,
                      titles: Sequence[str] = ()) -> None:
    """Refuse ``saved`` unless it equals ``current``, naming what changed; ``titles`` names the
    options of each operator in ``current["ops"]`` (e.g. ``"packing"``)."""
    found = first_difference(saved, current)
    if found is None:
        return
    path, old, new = found
    what = describe(path, titles)
    raise StateMismatchError(
        f"loader state {key!r} was written by a different pipeline: {what} changed "
        f"({path}: checkpoint {short(old)}, now {short(new)}). Resume with the same recipe, "
        "or start a new run.")


def describe(path: str, titles: Sequence[str] = (),
             hints: Mapping[str, str] = _RESUME_HINTS) -> str:
    """What a fingerprint path means to a user: ``ops[2].max_length`` is "the packing options"
    where ``titles[2]`` is ``"packing"``; other paths by their first prefix in
    :data:`FINGERPRINT_PARTS`, with the likely cause in ``hints`` (by prefix too) added."""
    op = re.match(r"ops\[(\d+)\]", path)
    if op and int(op.group(1)) < len(titles):
        return f"the {titles[int(op.group(1))]} options"
    text = next((text for prefix, text in FINGERPRINT_PARTS.items()
                 if path.startswith(prefix)), path)
    hint = next((hint for prefix, hint in hints.items() if path.startswith(prefix)), None)
    return f"{text} ({hint})" if hint else text


def short(value: Any, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
