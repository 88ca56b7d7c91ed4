"""Loader state: per-lane entries with a fingerprint, and how mismatches are explained.

``Pipeline.state_dict()`` returns ``{"lane_<l>": entry}`` for the lanes a rank owns. An entry
holds the lane's snapshot after its last *consumed* microbatch, the number of global
microbatches the run had consumed when the state was taken, and the fingerprint of everything
that must not change across a resume. Keys are lane-unique, so checkpoints written by any number
of ranks can be merged and loaded at any data-parallel size that divides the lane count.
Entries are plain data (dicts, lists, numbers, strings and numpy arrays), so a checkpoint does
not depend on the names or layout of Zephon's classes; ``STATE_VERSION`` changes when their
meaning does.
"""

from __future__ import annotations

from typing import Any

from zephon.errors import StateMismatchError
from zephon.records import DocSpan, Record

STATE_VERSION = 1


def lane_key(lane: int) -> str:
    return f"lane_{lane}"


_WHAT = {
    "lanes": "the lane count",
    "work_source.datasets": "the datasets or their files (another revision?)",
    "work_source.mixture": "the mixture weights",
    "work_source.seed": "the seed",
    "tokenize": "the tokenizer or tokenize options",
    "pack": "the packing options",
    "shuffle": "the shuffle options",
    "batch": "the batch options",
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


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], key: str) -> None:
    found = first_difference(saved, current)
    if found is None:
        return
    path, old, new = found
    what = next((text for prefix, text in _WHAT.items() if path.startswith(prefix)), path)
    raise StateMismatchError(
        f"loader state {key!r} was written by a different pipeline: {what} changed "
        f"({path}: checkpoint {_short(old)}, now {_short(new)}). Resume with the same recipe, "
        "or start a new run.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _record_to_plain(record: Record) -> dict[str, Any]:
    meta = dict(record.meta)
    if "documents" in meta:
        meta["documents"] = [[s.doc_id, s.dataset, s.doc_start, s.row_start, s.length]
                             for s in meta["documents"]]
    return {"payload": dict(record.payload), "meta": meta}


def _record_from_plain(plain: dict[str, Any]) -> Record:
    meta = dict(plain["meta"])
    if "documents" in meta:
        meta["documents"] = tuple(DocSpan(*s) for s in meta["documents"])
    return Record(dict(plain["payload"]), meta)


def lane_state_to_plain(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    """A lane snapshot as plain data (dicts, lists, numbers, strings, numpy arrays): a
    checkpoint never depends on the names or layout of Zephon's classes."""
    if snapshot is None:
        return None
    plain = dict(snapshot)
    plain["components"] = [{**c, "position": list(c["position"])}
                           for c in snapshot["components"]]
    if snapshot["packer"] is not None:
        plain["packer"] = {**snapshot["packer"], "bins": [
            [[list(doc), start, length] for doc, start, length in b]
            for b in snapshot["packer"]["bins"]]}
    if snapshot["shuffler"] is not None:
        plain["shuffler"] = {**snapshot["shuffler"], "buffer": [
            _record_to_plain(r) for r in snapshot["shuffler"]["buffer"]]}
    plain["out"] = [_record_to_plain(r) for r in snapshot["out"]]
    return plain


def lane_state_from_plain(plain: dict[str, Any] | None) -> dict[str, Any] | None:
    """The inverse of :func:`lane_state_to_plain`."""
    if plain is None:
        return None
    snapshot = dict(plain)
    snapshot["components"] = [{**c, "position": tuple(c["position"])}
                              for c in plain["components"]]
    if plain["packer"] is not None:
        snapshot["packer"] = {**plain["packer"], "bins": [
            [(tuple(doc), start, length) for doc, start, length in b]
            for b in plain["packer"]["bins"]]}
    if plain["shuffler"] is not None:
        snapshot["shuffler"] = {**plain["shuffler"], "buffer": [
            _record_from_plain(r) for r in plain["shuffler"]["buffer"]]}
    snapshot["out"] = [_record_from_plain(r) for r in plain["out"]]
    return snapshot
