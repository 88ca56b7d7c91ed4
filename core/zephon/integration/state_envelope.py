"""One envelope for the loader state every adapter saves, and one reader for all it loads.

A loader's state is lane-keyed: ``{"lane_<l>": entry}``, each entry a sealed artifact of
:mod:`zephon.engine.loader_state` describing what that lane handed out. Frameworks keep it in
three ways, and each is a form of the one envelope here:

- **rank**: this rank's lanes, for frameworks that save a state per data-parallel rank
  (Megatron-LM's ``train_dataloader_dprank*.pt`` files, torchdata's ``StatefulDataLoader``):
  ``rank_state(entries, framework=...)``;
- **job**: every rank's lanes gathered on each rank, for frameworks that save one file from
  one process (Lightning, accelerate): ``job_state(entries, group)``, a collective over
  JSON (:func:`zephon.distributed.gather_json`), never a pickle;
- **per lane**: ``{"lane_<l>": JSON text}``, for checkpointers that reshard by key and store
  opaque values (TorchTitan's DCP): :func:`state_as_text`.

The envelope is a sealed artifact (:mod:`zephon.artifacts`) of kind ``loader_state``:
``version``, ``scope``, ``lanes`` (the run's lane count), ``entries`` and ``framework`` (the
adapter's own plain fields, such as Megatron's ``consumed_samples``). :func:`read_state`
takes any form (one envelope, several, per-lane text, a bare lane-keyed mapping, and the
Megatron adapter's envelope of zephon 0.3) and returns the merged entries and the framework
fields of each envelope; it refuses pickled values, damaged or edited envelopes, lane keys out
of range, envelopes of different lane counts and two different entries for one lane, each by
name. What the entries hold is checked by the pipeline that loads them.

A resume at another data-parallel size reads the envelopes of every saving rank: each rank
takes its own lanes from the merge, as long as the new size divides the lane count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon.artifacts import ArtifactError, as_text, from_text, opened, sealed
from zephon.errors import StateMismatchError
from zephon.field_checks import StateFieldError, describe, need_dict, need_int

KIND = "loader_state"
"""The artifact kind of the envelope."""
VERSION = 1
SCOPES = ("rank", "job")
LANE_KEY = re.compile(r"lane_(\d+)")
LEGACY_MEGATRON = "zephon_megatron.loader"
"""The Megatron adapter's own envelope of zephon 0.3 (version 1), still read."""


@dataclass
class LoaderState:
    """What :func:`read_state` found."""

    entries: dict[str, Any]
    """``{"lane_<l>": entry}``, merged over every envelope read."""
    lanes: int | None = None
    """The run's lane count the envelopes name (None: bare entries, which do not say)."""
    framework: list[dict[str, Any]] = field(default_factory=list)
    """Each envelope's framework fields, in the order read."""

    @property
    def lane_count(self) -> int | None:
        """The run's lane count: the envelopes', else the entries' own (None: neither
        says; loading the entries then names what is wrong with them)."""
        from zephon.integration.lanes import saved_lanes

        return self.lanes if self.lanes is not None else saved_lanes(self.entries)


def rank_state(entries: Mapping[str, Any], *, lanes: int,
               framework: Mapping[str, Any] | None = None, scope: str = "rank"
               ) -> dict[str, Any]:
    """``entries`` (this rank's lanes) in a sealed envelope; ``framework``: the adapter's
    own fields (plain data)."""
    return sealed(KIND, {"version": VERSION, "scope": scope, "lanes": int(lanes),
                         "entries": dict(entries), "framework": dict(framework or {})})


def job_state(entries: Mapping[str, Any], *, lanes: int | None = None, group: Any = None,
              framework: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Every rank's lanes in one envelope, the same on every rank of ``group`` (a collective:
    call it on all of them at once, a rank with nothing to give passing ``{}``; None or one
    rank: this rank's). The ranks' entries travel as JSON and are checked like any state
    read back before they are merged. ``lanes`` None: the entries' own lane count. None when
    no rank gave an entry."""
    from zephon.integration.geometry import distributed
    from zephon.integration.lanes import saved_lanes

    gathered = [dict(entries)]
    if group is not None and distributed():
        from zephon.distributed import gather_json

        gathered = gather_json(dict(entries), group)
    merged = merge_states(_lane_keyed(part, f"rank {rank}'s loader state")
                          for rank, part in enumerate(gathered))
    lanes = lanes if lanes is not None else saved_lanes(merged)
    if not merged or lanes is None:
        return None
    return rank_state(merged, lanes=lanes, framework=framework, scope="job")


def read_state(value: Any, where: str) -> LoaderState:
    """The entries of a loader state in any form (see the module docstring), merged, with
    the lane count and framework fields of its envelopes."""
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    if not parts:
        raise StateMismatchError(f"{where}: no loader state")
    found = LoaderState({})
    merged = []
    for index, part in enumerate(parts):
        name = f"{where}[{index}]" if len(parts) > 1 else where
        entries, lanes, framework = _one(part, name)
        if lanes is not None:
            if found.lanes is not None and lanes != found.lanes:
                raise StateMismatchError(f"{name}: written by a run of {lanes} lanes, the "
                                         f"other states by one of {found.lanes}")
            found.lanes = lanes
        if framework is not None:
            found.framework.append(framework)
        merged.append(entries)
    found.entries = merge_states(merged)
    if found.lanes is not None:
        beyond = sorted(k for k in found.entries if int(LANE_KEY.fullmatch(k)[1]) >= found.lanes)
        if beyond:
            raise StateMismatchError(f"{where}: {beyond[0]} is beyond the {found.lanes} lanes "
                                     "the state names")
    return found


def _one(value: Any, where: str) -> tuple[dict[str, Any], int | None, dict[str, Any] | None]:
    """(entries, lanes, framework fields) of one state in any form."""
    value = from_text(value, where)
    if isinstance(value, Mapping) and value.get("artifact") == KIND:
        fields = opened(dict(value), KIND, where, _check_envelope)
        return _lane_keyed(fields["entries"], where), fields["lanes"], fields["framework"]
    if isinstance(value, Mapping) and value.get("format") == LEGACY_MEGATRON:
        if value.get("version") != 1 or not isinstance(value.get("pipeline"), Mapping):
            raise ArtifactError(f"{where}: a {LEGACY_MEGATRON} state of version "
                                f"{describe(value.get('version'))} is not one zephon reads")
        framework = {k: v for k, v in value.items()
                     if k not in ("format", "version", "pipeline", "lanes")}
        lanes = value.get("lanes")
        return (_lane_keyed(value["pipeline"], where),
                lanes if isinstance(lanes, int) else None, framework)
    if isinstance(value, Mapping):
        return _lane_keyed(value, where), None, None
    raise ArtifactError(f"{where}: a loader state is a mapping, not {describe(value)}")


def _check_envelope(fields: dict[str, Any]) -> dict[str, Any]:
    need_int(fields.get("version"), "version", VERSION, VERSION)
    if fields.get("scope") not in SCOPES:
        raise StateFieldError("scope", f"is {describe(fields.get('scope'))}, must be one of "
                                       f"{list(SCOPES)}")
    return {"lanes": need_int(fields.get("lanes"), "lanes", 1),
            "entries": need_dict(fields.get("entries"), "entries"),
            "framework": need_dict(fields.get("framework"), "framework")}


def _lane_keyed(value: Any, where: str) -> dict[str, Any]:
    """``{"lane_<l>": entry}`` with every entry decoded from text where it is stored so;
    another key is refused by name (a state of another loader)."""
    if not isinstance(value, Mapping):
        raise ArtifactError(f"{where}: the lane entries are {describe(value)}, not a mapping")
    foreign = sorted(str(k) for k in value if not LANE_KEY.fullmatch(str(k)))
    if foreign:
        raise ArtifactError(f"{where}: keys {foreign[:4]} are not lane entries (lane_<l>): "
                            "this state was not written by zephon")
    entries = {key: from_text(entry, f"{where}: {key}") for key, entry in value.items()}
    for key, entry in entries.items():
        if not isinstance(entry, Mapping):
            raise ArtifactError(f"{where}: {key} is {describe(entry)}, not a lane entry")
    return entries


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The lane-keyed states of several ranks (``{"lane_<l>": entry}`` each) as one. A lane
    found twice must hold the same entry: two different ones come from different runs or
    steps, an error naming the lane."""
    merged: dict[str, Any] = {}
    for state in states:
        for key, entry in state.items():
            if key in merged and merged[key] != entry:
                raise StateMismatchError(f"two loader states hold different entries for "
                                         f"{key!r}: they were written by different runs or at "
                                         "different steps")
            merged[key] = entry
    return merged


def state_as_text(state: Mapping[str, Any]) -> dict[str, str]:
    """``{"lane_<l>": entry}`` with each entry as JSON text, for checkpointers that store
    opaque values per key (TorchTitan's DCP): plain data, never a pickle."""
    return {key: as_text(entry) for key, entry in state.items()}


def state_from_text(state: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The inverse of :func:`state_as_text` (entries already decoded pass as they are);
    pickled entries are refused by name, never loaded."""
    return read_state(dict(state), where).entries
