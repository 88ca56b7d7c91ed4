"""What a loader handed a trainer, measured: the ``zephon/`` metrics adapters log.

:class:`LoaderMeter` counts microbatches, tokens, padding, loss-bearing labels and the time
the trainer waited for each microbatch. :meth:`LoaderMeter.window` gives the metrics of the
window since its last call plus the pipeline report's running mixture shares, drops and
filters; both adapters hand them to their framework's loggers (TensorBoard, W&B).
"""

from __future__ import annotations

import time
from typing import Any

_COUNTS = ("microbatches", "tokens", "padding", "valid", "wait_s")


class LoaderMeter:
    def __init__(self) -> None:
        self.totals: dict[str, float] = dict.fromkeys(_COUNTS, 0)
        self._mark = dict(self.totals)
        self._since = time.perf_counter()

    def record(self, tokens: int, padding: int, valid: int, wait_s: float) -> None:
        """One microbatch handed out: its tokens, padding, labels that count, and the wait."""
        totals = self.totals
        totals["microbatches"] += 1
        totals["tokens"] += tokens
        totals["padding"] += padding
        totals["valid"] += valid
        totals["wait_s"] += wait_s

    def window(self, report: Any) -> dict[str, float]:
        """``zephon/`` metrics since the last call; ``report`` is the pipeline's report."""
        now = time.perf_counter()
        delta = {k: self.totals[k] - self._mark[k] for k in _COUNTS}
        elapsed = max(now - self._since, 1e-9)
        self._mark, self._since = dict(self.totals), now
        tokens = max(1, delta["tokens"])
        out = {
            "zephon/wait_ms": 1000 * delta["wait_s"] / max(1, delta["microbatches"]),
            "zephon/tokens_per_s": delta["tokens"] / elapsed,
            "zephon/padding_share": delta["padding"] / tokens,
            "zephon/loss_share": delta["valid"] / tokens,
        }
        for dataset in report.datasets:
            out[f"zephon/realized/{dataset.name}"] = dataset.realized_share
            out[f"zephon/target/{dataset.name}"] = dataset.target_share
        out["zephon/dropped_documents"] = (report.dropped.get("documents", 0)
                                           + report.leftover.get("documents", 0))
        out["zephon/filtered_documents"] = sum(d.filtered for d in report.datasets)
        return out

    def summary(self) -> str:
        """Totals in one line."""
        s = self.totals
        tokens = max(1, s["tokens"])
        rate = s["tokens"] / s["wait_s"] if s["wait_s"] else float("inf")
        return (f"{int(s['microbatches'])} microbatches, {int(s['tokens'])} tokens, padding "
                f"{100 * s['padding'] / tokens:.2f}%, loss-bearing "
                f"{100 * s['valid'] / tokens:.2f}%, loader "
                f"{1000 * s['wait_s'] / max(1, s['microbatches']):.2f} ms/microbatch "
                f"({rate:,.0f} tokens/s when waited on)")


def metrics_line(step: int, metrics: dict[str, float]) -> str:
    """The console line of one log step."""
    shares = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.3f}" for k, v in metrics.items()
                       if k.startswith("zephon/realized/"))
    return (f"zephon: step {step}: wait {metrics['zephon/wait_ms']:.2f} ms/microbatch, "
            f"{metrics['zephon/tokens_per_s']:,.0f} tokens/s, padding "
            f"{100 * metrics['zephon/padding_share']:.2f}%, loss-bearing "
            f"{100 * metrics['zephon/loss_share']:.2f}%, realized {shares}, dropped "
            f"{int(metrics['zephon/dropped_documents'])}, filtered "
            f"{int(metrics['zephon/filtered_documents'])}")
