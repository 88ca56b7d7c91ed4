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
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import StateMismatchError

STATE_VERSION = 2
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


def from_portable(value: Any) -> Any:
    """The inverse of :func:`to_portable` (tuples come back as lists)."""
    if isinstance(value, dict):
        if len(value) == 1 and _ARRAY in value:
            dtype, shape, data = value[_ARRAY]
            array = np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype))
            return array.reshape(shape).copy()
        return {key: from_portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_portable(item) for item in value]
    return value


def lane_key(lane: int) -> str:
    return f"lane_{lane}"


_WHAT = {
    "lanes": "the lane count",
    "work_source.datasets": "the datasets or their files (another revision?)",
    "work_source.mixture": "the mixture weights",
    "work_source.seed": "the seed",
    "work_source": "the work source options",
    "ops": "the operators",
}


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
    op = re.match(r"ops\[(\d+)\]", path)
    if op and int(op.group(1)) < len(titles):
        what = f"the {titles[int(op.group(1))]} options"
    else:
        what = next((text for prefix, text in _WHAT.items() if path.startswith(prefix)), path)
    raise StateMismatchError(
        f"loader state {key!r} was written by a different pipeline: {what} changed "
        f"({path}: checkpoint {_short(old)}, now {_short(new)}). Resume with the same recipe, "
        "or start a new run.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
