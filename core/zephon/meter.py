"""What a loader handed a trainer, measured: the ``zephon/`` metrics adapters log.

:class:`LoaderMeter` counts microbatches, tokens, padding, loss-bearing labels and the time
the trainer waited for each microbatch. :meth:`LoaderMeter.window` gives the metrics of the
window since its last call plus the pipeline report's running mixture shares (realized, and
the target: a schedule's integral up to the job's position), the tokens each dataset has
handed to the trainer so far (``zephon/tokens_seen/<name>``), drops and filters; both adapters
hand them to their framework's loggers (TensorBoard, W&B).

Job figures. Given the data-parallel ``group``, every figure :meth:`~LoaderMeter.window` gives
under ``zephon/`` describes the whole job, not this rank: one all-reduce (SUM) of about
``9 + 2 x datasets`` float64 values on the host, at each log step, over a gloo group. All ranks
call it at the same step (adapters log on every reader at the same microbatch count), so every
rank, the one writing TensorBoard and the one printing the console line alike, gets the same
numbers, and they are those of the same data read at another data-parallel size: the counts
summed are of the microbatches handed out up to that step. This costs one small collective per
log step (every 10 steps by default), never one per microbatch, and no device synchronization;
it is exact where figures carried on the end-of-data agreement would lag it by the rounds
between agreements. ``replicas`` ranks read each data-parallel rank's lanes (TorchTitan's loader
agrees over the whole world, where tensor-parallel peers read alike): sums are divided by it.
This rank's own wait and throughput are logged too, under ``zephon/this_rank/``.
"""

from __future__ import annotations

import time
from typing import Any

_COUNTS = ("microbatches", "tokens", "padding", "valid", "wait_s")


class LoaderMeter:
    def __init__(self, group: Any = None, replicas: int = 1) -> None:
        self.totals: dict[str, float] = dict.fromkeys(_COUNTS, 0)
        self._mark = dict(self.totals)
        self._since = time.perf_counter()
        self.group = group
        """The process group whose ranks' figures are summed (None: this rank alone)."""
        self.replicas = max(1, replicas)

    def record(self, tokens: int, padding: int, valid: int, wait_s: float) -> None:
        """One microbatch handed out: its tokens, padding, labels that count, and the wait."""
        totals = self.totals
        totals["microbatches"] += 1
        totals["tokens"] += tokens
        totals["padding"] += padding
        totals["valid"] += valid
        totals["wait_s"] += wait_s

    def window(self, report: Any) -> dict[str, float]:
        """``zephon/`` metrics since the last call, of the job when there is a ``group``;
        ``report`` is the pipeline's report."""
        now = time.perf_counter()
        delta = {k: self.totals[k] - self._mark[k] for k in _COUNTS}
        elapsed = max(now - self._since, 1e-9)
        self._mark, self._since = dict(self.totals), now
        mine = {"zephon/this_rank/wait_ms": 1000 * delta["wait_s"] / max(1, delta["microbatches"]),
                "zephon/this_rank/tokens_per_s": delta["tokens"] / elapsed}
        names = [d.name for d in report.datasets]
        unit = "handed_tokens" if report.mix_by == "tokens" else "handed_documents"
        values = [*(float(delta[k]) for k in _COUNTS), elapsed, 1.0,
                  float(report.dropped.get("documents", 0) + report.leftover.get("documents", 0)),
                  float(sum(d.filtered for d in report.datasets)),
                  *(float(getattr(d, unit)) for d in report.datasets),
                  *(float(d.handed_tokens) for d in report.datasets)]
        job = self._summed(values)
        counts = dict(zip(_COUNTS, job[:5], strict=True))
        ranks = job[6] * self.replicas
        tokens = max(1.0, counts["tokens"])
        out = {
            "zephon/wait_ms": 1000 * counts["wait_s"] / max(1.0, counts["microbatches"]),
            "zephon/tokens_per_s": counts["tokens"] / (job[5] * self.replicas / ranks),
            "zephon/padding_share": counts["padding"] / tokens,
            "zephon/loss_share": counts["valid"] / tokens,
        }
        shown, seen = job[9:9 + len(names)], job[9 + len(names):]
        total = sum(shown) or 1.0
        for name, amount, tokens_seen, dataset in zip(names, shown, seen, report.datasets,
                                                       strict=True):
            out[f"zephon/realized/{name}"] = amount / total
            out[f"zephon/target/{name}"] = dataset.target_share
            out[f"zephon/tokens_seen/{name}"] = tokens_seen
        out["zephon/dropped_documents"] = job[7]
        out["zephon/filtered_documents"] = job[8]
        out.update(mine)
        return out

    def _summed(self, values: list[float]) -> list[float]:
        """``values`` summed over the group's ranks and divided by ``replicas``; this rank's
        own values without a group."""
        group = self.group
        if group is None:
            return values
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return values
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return [v / self.replicas for v in tensor.tolist()]

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
    """The console line of one log step (job figures, as :meth:`LoaderMeter.window` gives)."""
    shares = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.3f}" for k, v in metrics.items()
                       if k.startswith("zephon/realized/"))
    return (f"zephon: step {step}: wait {metrics['zephon/wait_ms']:.2f} ms/microbatch, "
            f"{metrics['zephon/tokens_per_s']:,.0f} tokens/s, padding "
            f"{100 * metrics['zephon/padding_share']:.2f}%, loss-bearing "
            f"{100 * metrics['zephon/loss_share']:.2f}%, realized {shares}, dropped "
            f"{int(metrics['zephon/dropped_documents'])}, filtered "
            f"{int(metrics['zephon/filtered_documents'])}")
