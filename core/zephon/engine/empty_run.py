"""Why a run delivered no batch, in terms a user can act on.

A run whose agreed end of data is its very first round, and whose last round
(:mod:`zephon.engine.last_round`) holds fewer microbatches than there are ranks, hands out
nothing. That is never what a user wants, so :class:`zephon.engine.rank.RankStream` raises a
DataError with this message on every rank (each rank reaches the same agreed end). The message
is built from the counts the report shows (the ``"stats"`` of the lanes' final snapshots), for
the lanes of the rank that raises, and the microbatches the whole job made, and names the first
cause that applies:

1. microbatches were made, but fewer than one for each data-parallel rank, which take them a
   group of one each at a time;
2. documents were delivered, but ``batch(drop_last=True)`` dropped the short last batch;
3. documents were delivered but made no microbatch (some row operator held them back);
4. rows were read and every one was dropped (empty, filtered, ...), counted by reason;
5. no row was read at all: the datasets are empty.
"""

from __future__ import annotations

from typing import Any

from zephon.report import sum_stats


def empty_run_message(names: list[str], snapshots: dict[int, dict[str, Any] | None],
                      made: int, rank: int, world_size: int) -> str:
    """The message for a run that delivered no batch; ``snapshots`` are this rank's lanes'
    final snapshots, ``made`` the microbatches all lanes made."""
    final = {lane: s for lane, s in snapshots.items() if s}
    stats = sum_stats(node["stats"] for s in final.values() for node in s["nodes"]
                      if "stats" in node)
    documents = {n: stats.get("documents", {}).get(n, 0) for n in names}
    skipped = {n: dict(stats.get("skipped", {}).get(n, {})) for n in names}
    delivered = sum(documents.values())
    tokens = sum(stats.get("tokens", {}).get(n, 0) for n in names)
    read = delivered + sum(sum(s.values()) for s in skipped.values())
    flushed = stats.get("dropped", {}).get("rows", 0)
    where = (f" on rank {rank} of {world_size} (lanes {sorted(snapshots)})"
             if world_size > 1 else "")
    if made >= world_size:  # ranks that could not exchange their lanes' states
        cause = (f"the lanes made {made} microbatch(es), but no round (one of each lane) was "
                 "complete, and the ranks could not exchange their lanes' states to hand them "
                 "out in the last round: torch.distributed is not initialized")
    elif made:
        cause = (f"the lanes made {made} microbatch(es) in all, fewer than one for each of the "
                 f"{world_size} data-parallel ranks, which are handed one each at a time so "
                 "that every rank gets as many. Use fewer ranks, a smaller microbatch_size or "
                 "more data")
    elif delivered and flushed:
        cause = (f"{delivered} document(s) ({tokens} tokens) were read, but they made only "
                 f"{flushed} row(s), fewer than one microbatch, which batch(drop_last=True) "
                 "dropped. Use batch(..., drop_last=False), a smaller microbatch_size, fewer "
                 "lanes, or more data")
    elif delivered:
        cause = f"{delivered} document(s) ({tokens} tokens) were read but made no microbatch"
    elif read:
        cause = (f"{read} row(s) were read and every one was dropped. Check the filters and "
                 "the text field")
    else:
        cause = "the datasets are empty: no row was read"
    detail = "; ".join(_dataset_line(n, documents[n], skipped[n]) for n in names)
    return f"no microbatch could be made{where}: {cause} ({detail})"


def _dataset_line(name: str, documents: int, skipped: dict[str, int]) -> str:
    rows = documents + sum(skipped.values())
    line = f"{name!r}: {rows} row(s) read, {documents} document(s) delivered"
    if skipped:
        line += ", dropped " + ", ".join(f"{r}: {n}" for r, n in sorted(skipped.items()))
    return line
