"""What a pipeline delivered, dropped and left over, per dataset: nothing is lost silently."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DatasetReport:
    name: str
    target_share: float
    """Target share of tokens (token mixing) or documents (document mixing)."""
    documents: int = 0
    tokens: int = 0
    empty_documents: int = 0
    """Empty or null texts skipped (they produce no tokens)."""
    realized_share: float = 0.0
    """Delivered share in the mixing unit (tokens or documents)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows that produced no document, by reason (``empty``; for chat data also
    ``no_assistant``, ``unknown_role``, ``missing_field``, ``invalid``)."""


@dataclass
class PipelineReport:
    """Counts over the lanes this rank owns, up to the last consumed microbatch."""

    mix_by: str
    datasets: list[DatasetReport]
    microbatches: int = 0
    padding_tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows, documents and tokens dropped by ``batch(drop_last=True)`` at a flush."""
    leftover: dict[str, int] = field(default_factory=dict)
    """Microbatches, rows, documents and tokens of the final incomplete round."""
    finished: bool = False

    def __str__(self) -> str:
        lines = [f"{'dataset':<24}{'documents':>12}{'tokens':>14}{'empty':>8}"
                 f"{'target':>9}{'realized':>10}   (mixing by {self.mix_by})"]
        for d in self.datasets:
            lines.append(f"{d.name:<24}{d.documents:>12,}{d.tokens:>14,}{d.empty_documents:>8,}"
                         f"{d.target_share:>9.3f}{d.realized_share:>10.3f}")
            others = {k: v for k, v in d.skipped.items() if k != "empty"}
            if others:
                lines.append(f"{'':<24}skipped rows: {others}")
        lines.append(f"microbatches {self.microbatches:,}; padding tokens "
                     f"{self.padding_tokens:,}; dropped at flush {self.dropped}; "
                     f"left over at end {self.leftover}")
        return "\n".join(lines)
