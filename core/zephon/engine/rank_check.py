"""Ranks that disagree fail at start: every data-parallel rank must run the same plan.

A rank's data is a pure function of the pipeline's fingerprint (recipe, files, seed, lanes),
its unit plan and its data-parallel rank. Ranks that differ in any of these read overlapping
and missing data with no other symptom: in a two-rank trial with seeds 1 and 2 (the classic
``seed=rank`` bug), many documents were read by both ranks and others by neither (measured:
docs/measurements.md). A node that misses a local file, or holds another version of it, is the
same.

Algorithm. When a pipeline's runtime is built, each rank digests its fingerprint and unit plan
into 8 bytes and the data-parallel group all-gathers ``(digest, dp_rank, dp_world_size)``:
one collective of 24 bytes a rank (24 KiB over 1,024 ranks), on the gloo group the end-of-data
agreement uses, so no device is touched. Every rank receives the same rows and so reaches the
same verdict:

- ranks that report different ``dp_world_size`` values, or claim one ``dp_rank`` more often
  than the group has peers per data-parallel rank (one in a data-parallel group; more where
  the group also holds tensor or pipeline peers, which read the same lanes), fail at once;
- ranks whose digests differ issue one more collective, the fingerprints themselves gathered
  as JSON (:func:`zephon.distributed.gather_json`), and fail naming the first difference
  between each differing rank and the first rank (``work_source.seed: rank 0 has 1, rank 1
  has 2``).

Limits: it runs only where ``torch.distributed`` is initialized and the group is known (the
``process_group`` option, or the default group when its size is ``dp_world_size``) and the
group's size is a multiple of ``dp_world_size``; elsewhere (ranks simulated in one process)
the ranks cannot be compared, which is logged. Before the collective the ranks meet in the
job's store (:func:`zephon.distributed.arrive`): a rank whose start-up failed before the check
(a missing file raises while planning) has published its error there, and its peers fail at
once naming it instead of waiting in the collective; one that never arrives is named after
``startup_timeout_s``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from zephon.distributed import arrive, gather_json, world_gloo_group
from zephon.engine import loader_state as state
from zephon.engine.loader_state import first_difference, short, to_portable
from zephon.errors import ConfigError
from zephon.logs import get_logger
from zephon.work.protocol import WorkSource

log = get_logger(__name__)

_RANK_HINTS = {"work_source.datasets": "a file missing or different on some node?",
               "work_source.seed": "a seed derived from the rank?"}
"""Likely causes of a part that differs between ranks."""


def plan_digests(source: WorkSource, lanes: int) -> dict[str, str]:
    """A digest of each dataset's planned units (for files: file index, kind, group, start,
    stop)."""
    return {work.name: work.digest() for work in source.work(lanes)}


def digest(identity: dict[str, Any]) -> int:
    """8 bytes of a SHA-256 over ``identity`` as canonical JSON, as a signed int64."""
    text = json.dumps(to_portable(identity), sort_keys=True, default=repr)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def describe(path: str, titles: Sequence[str] = ()) -> str:
    """What a fingerprint path means to a user, in words for ranks that differ."""
    return state.describe(path, titles, _RANK_HINTS)


def check_ranks_agree(identity: Callable[[], dict[str, Any]], dp_rank: int,
                      dp_world_size: int, process_group: Any = None,
                      titles: Sequence[str] = ()) -> None:
    """Raise :class:`ConfigError` on every rank unless all ranks of the data-parallel group
    have the same ``identity()`` (computed only when there are ranks to compare), the same
    ``dp_world_size`` and every ``dp_rank`` held by the same number of ranks; see the module
    docstring."""
    group = _group(dp_world_size, process_group)
    if group is None:
        return
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if size % dp_world_size:  # ranks simulated in one process, or a group of other ranks
        log.warning("zephon: the process group has %d ranks, not a multiple of "
                    "dp_world_size=%d, so the ranks' plans cannot be compared", size,
                    dp_world_size)
        return
    mine = identity()
    arrive(dist.get_process_group_ranks(group), "zephon's rank check")
    rows = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(rows, torch.tensor([digest(mine), dp_rank, dp_world_size],
                                       dtype=torch.int64), group=group)
    digests, ranks, worlds = zip(*(row.tolist() for row in rows), strict=True)
    if len(set(worlds)) > 1:
        raise ConfigError("ranks disagree on dp_world_size: " + ", ".join(
            f"rank {i} has {w}" for i, w in enumerate(worlds)))
    _check_dp_ranks(list(ranks), size // dp_world_size)
    if len(set(digests)) == 1:
        return
    everyone = gather_json(json.loads(json.dumps(to_portable(mine), default=repr)), group)
    raise ConfigError(_disagreement(everyone, titles))


def _check_dp_ranks(ranks: list[int], peers: int) -> None:
    """Each dp_rank ``0..W-1`` must be held by ``peers`` ranks of the group: one where the
    group is the data-parallel group, more where it also holds tensor/pipeline peers, which
    read the same lanes."""
    world = len(ranks) // peers
    for dp_rank in range(world):
        holders = [i for i, r in enumerate(ranks) if r == dp_rank]
        if len(holders) > peers:
            raise ConfigError(
                f"ranks disagree on who reads what: dp_rank {dp_rank} is claimed by ranks "
                f"{holders} of the group (dp_ranks {ranks}), which would read the same data; "
                f"each data-parallel rank must pass its own dp_rank, 0..{world - 1}")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise ConfigError(f"ranks disagree on who reads what: no rank holds dp_rank "
                          f"{missing[0]} (dp_ranks {ranks}), so its data would never be read")


def _group(dp_world_size: int, process_group: Any) -> Any:
    """The group to compare over, or None when ranks cannot (or need not) be compared."""
    if dp_world_size == 1:
        return None
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is present wherever ranks exist
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    if process_group is not None:
        return process_group
    if dist.get_world_size() != dp_world_size:
        return None
    return world_gloo_group()


def _disagreement(identities: list[dict[str, Any]], titles: Sequence[str]) -> str:
    """The message for ranks whose identities differ: each differing rank against rank 0."""
    lines = []
    for rank, other in enumerate(identities[1:], start=1):
        found = first_difference(identities[0], other)
        if found is None:
            continue
        path, first, theirs = found
        lines.append(f"rank {rank} differs from rank 0 in {describe(path, titles)} "
                     f"({path}: rank 0 has {short(first, 100)}, "
                     f"rank {rank} has {short(theirs, 100)})")
    if not lines:  # pragma: no cover - equal fingerprints digest equally
        lines.append("their fingerprints digest differently")
    shown = lines[:4] + ([f"... and {len(lines) - 4} more rank(s)"] if len(lines) > 4 else [])
    return ("the data-parallel ranks would read different data, so some documents would be "
            "read twice and others never: " + "; ".join(shown) + ". Give every rank the same "
            "recipe, seed and files.")
