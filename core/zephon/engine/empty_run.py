"""Why a run delivered no batch, in terms a user can act on.

A run whose agreed end of data is its very first round hands out nothing. That is never what a
user wants, so :class:`zephon.engine.rank.RankStream` raises a DataError with this message on
every rank (each rank reaches the same agreed end). The message is built from the counts the
report shows (the ``"stats"`` of the lanes' final snapshots and the microbatches left over), for
the lanes of the rank that raises, and names the first cause that applies:

1. microbatches were made but no round was complete: some lane (here or on another rank) made
   none, and batches are handed out a round (one microbatch of every lane) at a time;
2. documents were delivered, but ``batch(drop_last=True)`` dropped the short last batch;
3. documents were delivered but made no microbatch (some row operator held them back);
4. rows were read and every one was dropped (empty, filtered, ...), counted by reason;
5. no row was read at all: the datasets are empty.
"""

from __future__ import annotations

from typing import Any

from zephon.report import sum_stats


def empty_run_message(names: list[str], snapshots: dict[int, dict[str, Any] | None],
                      leftover: dict[str, int], rank: int, world_size: int, lanes: int) -> str:
    """The message for a run that delivered no batch; ``snapshots`` are this rank's lanes'
    final snapshots, ``leftover`` what they made that no rank handed out."""
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
    made = leftover.get("microbatches", 0)
    if made:
        idle = [lane for lane in sorted(snapshots) if not (final.get(lane) or {})
                .get("microbatches")]
        which = f"lane(s) {idle}" if idle else "a lane of another rank"
        cause = (f"the lanes made {made} microbatch(es), but batches are handed out a round at "
                 f"a time, one microbatch from each of the {lanes} lanes, and {which} made "
                 "none. Use fewer lanes (options(lanes=...)) or more data")
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
