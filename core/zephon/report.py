"""What a pipeline delivered, dropped and left over, per dataset: nothing is lost silently.

Reports are built from the ``"stats"`` entries of the nodes' snapshots in the lanes' consumed
state, summed over the lanes a rank owns (:func:`sum_stats`): the lanes as they were when the
trainer took its last microbatch. They tell apart what the lanes had *read* by then (documents
and tokens that entered the pipeline, including what still waits in open rows and the shuffle
buffer) from what was *handed* to the trainer (the rows of the microbatches it took). Realized
shares and padding are of what was handed: what the model saw.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FILTERED_PREFIX = "filtered:"


@dataclass
class DatasetReport:
    name: str
    target_share: float
    """Target share of tokens (token mixing) or documents (document mixing)."""
    documents: int = 0
    """Documents read (entered the pipeline), read-ahead and buffers included."""
    tokens: int = 0
    """Tokens of the documents read."""
    empty_documents: int = 0
    """Empty or null texts skipped (they produce no tokens)."""
    realized_share: float = 0.0
    """Share of what was handed to the trainer, in the mixing unit (tokens or documents)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows (or pieces) that went no further, by reason (``empty``; for chat data also
    ``no_assistant``, ``unknown_role``, ``missing_field``, ``invalid``; ``filtered:<fn>`` for
    each filter)."""
    skipped_files: tuple[str, ...] = ()
    """Paths found under the dataset's path but not read, each with its reason."""
    handed_documents: int = 0
    """Documents whose first token was handed to the trainer."""
    handed_tokens: int = 0
    """Tokens handed to the trainer (documents' tokens; padding apart)."""

    @property
    def filtered(self) -> int:
        """Documents that filters rejected."""
        return sum(n for reason, n in self.skipped.items()
                   if reason.startswith(FILTERED_PREFIX))


@dataclass
class StageReport:
    """One stage of a mixture schedule as far as the lanes reached it."""

    stage: int
    """Its number, from 1."""
    begins: int
    """The job token it begins at."""
    reached: int
    """The job token the lanes had reached in it (its end, once past it)."""
    target: dict[str, float]
    """Each dataset's target share over that span (a ramp's shares averaged)."""
    mixed: dict[str, float]
    """Each dataset's share of the tokens the mixer handed on in it (what was read for
    rows; the trainer receives them within a row or a shuffle buffer)."""

    def __str__(self) -> str:
        shares = ", ".join(f"{n} {self.target.get(n, 0):.3f}/{self.mixed.get(n, 0):.3f}"
                           for n in self.target)
        return (f"stage {self.stage} (job tokens {self.begins:,} to {self.reached:,}): "
                f"target/mixed {shares}")


@dataclass
class PipelineReport:
    """Counts over the lanes this rank owns, up to the last consumed microbatch."""

    mix_by: str
    datasets: list[DatasetReport]
    microbatches: int = 0
    padding_tokens: int = 0
    """Padding tokens in the rows handed to the trainer."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows, documents and tokens dropped by ``batch(drop_last=True)`` at a flush."""
    leftover: dict[str, int] = field(default_factory=dict)
    """Microbatches, rows, documents and tokens of the final incomplete round."""
    finished: bool = False
    lanes: tuple[int, ...] = ()
    """The lanes counted (this rank's), of ``total_lanes``."""
    total_lanes: int = 0
    stages: list[StageReport] = field(default_factory=list)
    """Per stage of a mixture schedule reached so far: target and mixed shares."""

    def __str__(self) -> str:
        lines = []
        if self.lanes and len(self.lanes) < self.total_lanes:
            shown = ", ".join(str(lane) for lane in self.lanes)
            lines.append(f"this rank's lanes only: {shown} of {self.total_lanes}")
        lines += [f"{'':<24}{'handed to the trainer':>26}{'read (buffers included)':>26}",
                 f"{'dataset':<24}{'documents':>12}{'tokens':>14}{'documents':>12}{'tokens':>14}"
                 f"{'empty':>8}{'target':>9}{'realized':>10}   (mixing by {self.mix_by})"]
        for d in self.datasets:
            lines.append(f"{d.name:<24}{d.handed_documents:>12,}{d.handed_tokens:>14,}"
                         f"{d.documents:>12,}{d.tokens:>14,}{d.empty_documents:>8,}"
                         f"{d.target_share:>9.3f}{d.realized_share:>10.3f}")
            others = {k: v for k, v in d.skipped.items() if k != "empty"}
            if others:
                lines.append(f"{'':<24}skipped rows: {others}")
            if d.skipped_files:
                shown = ", ".join(d.skipped_files[:3])
                more = len(d.skipped_files) - 3
                lines.append(f"{'':<24}skipped files: {shown}"
                             + (f" and {more} more" if more > 0 else ""))
        lines += [str(stage) for stage in self.stages]
        lines.append(f"microbatches {self.microbatches:,}; padding tokens "
                     f"{self.padding_tokens:,}; dropped at flush {self.dropped}; "
                     f"left over at end {self.leftover}")
        return "\n".join(lines)


def sum_stats(stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Nested dicts of counts added key by key."""
    total: dict[str, Any] = {}
    for entry in stats:
        _add(total, entry)
    return total


def _add(into: dict[str, Any], entry: dict[str, Any]) -> None:
    for key, value in entry.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        else:
            into[key] = into.get(key, 0) + value


def build_report(stats: dict[str, Any], names: list[str], weights: Iterable[float],
                 by_tokens: bool, microbatches: int, leftover: dict[str, int],
                 finished: bool, skipped_files: dict[str, tuple[str, ...]] | None = None
                 ) -> PipelineReport:
    """A report from summed node stats (see :func:`sum_stats`). ``names`` may include
    datasets of weight 0, which read nothing and are listed with their target of 0."""
    documents = {n: stats.get("documents", {}).get(n, 0) for n in names}
    tokens = {n: stats.get("tokens", {}).get(n, 0) for n in names}
    skipped = {n: dict(stats.get("skipped", {}).get(n, {})) for n in names}
    handed = stats.get("handed", {})
    handed_documents = {n: handed.get("documents", {}).get(n, 0) for n in names}
    handed_tokens = {n: handed.get("tokens", {}).get(n, 0) for n in names}
    unit = handed_tokens if by_tokens else handed_documents
    total = sum(unit.values()) or 1
    files = skipped_files or {}
    datasets = [DatasetReport(n, float(w), documents[n], tokens[n], skipped[n].get("empty", 0),
                              unit[n] / total, skipped[n], files.get(n, ()),
                              handed_documents[n], handed_tokens[n])
                for n, w in zip(names, weights, strict=True)]
    dropped = {"rows": 0, "documents": 0, "tokens": 0, **stats.get("dropped", {})}
    return PipelineReport("tokens" if by_tokens else "documents", datasets, microbatches,
                          handed.get("padding_tokens", 0), dropped, dict(leftover), finished)
