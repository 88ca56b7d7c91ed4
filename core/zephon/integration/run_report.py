"""The end-of-run report: what the whole job's training readers handed out, printed once.

Each data-parallel reader knows only its own lanes (:meth:`Pipeline.report`). Where every
reader reaches the same point together (the last training step a framework counts, or the end
of the data, which the readers agree on), :meth:`EndOfRunReport.print` with ``job=True``
gathers the readers' reports over their host group and adds them up: documents, tokens,
skipped rows and padding per dataset, microbatches, drops and leftovers; the realized shares
are recomputed from the summed amounts. The reports travel as JSON
(:func:`zephon.distributed.gather_json`), never as pickled objects.

A run stopped otherwise (Ctrl-C, an error, an exit interval) has no common point, and a
collective there could wait for a rank that is gone: its report covers this rank's lanes and
says so (:class:`~zephon.report.PipelineReport` names them).

Only global rank 0 prints, once per process, whichever way the run ends; the exit hook of
:meth:`EndOfRunReport.at_exit` covers runs stopped early. The header counts on the table's
basis: rows of ``seq_len + 1`` tokens, of which the model reads the first ``seq_len`` as
inputs and the last is a label only.
"""

from __future__ import annotations

import atexit
import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

from zephon.integration.geometry import distributed, global_rank
from zephon.meter import LoaderMeter
from zephon.report import DatasetReport, PipelineReport


class EndOfRunReport:
    """The report of one training reader (see the module docstring). It holds the meter and
    the pipeline, not the adapter's loader, so that a dropped loader is freed after it."""

    def __init__(self, meter: LoaderMeter, pipeline: Any, *, group: Any = None,
                 rows: int = 1, row_tokens: int = 0,
                 say: Callable[[str], None] | None = None, due: bool = True):
        """``group``: the readers' host group (None: this rank's lanes only); ``rows``,
        ``row_tokens``: rows per microbatch and tokens per packed row (0: derived from the
        figures); ``say``: where the report goes (default: printed); ``due``: False for a
        loader whose run is not reported (validation)."""
        self.meter, self.pipeline, self.group = meter, pipeline, group
        self.rows, self.row_tokens, self.due = rows, row_tokens, due
        self.say = say or (lambda text: print(text, flush=True))

    def print(self, why: str, job: bool = False) -> bool:
        """Report the run (``why``: how it ended) unless it was reported already; ``job``:
        every reader is here now (a collective). Returns whether this call printed it."""
        if not self.due:
            return False
        report, totals = self.pipeline.report(), dict(self.meter.totals)
        if job:  # every reader is here: no early return before the collective
            report, totals = job_report(report, totals, self.group)
        if not totals["microbatches"]:
            return False
        self.due = False
        if global_rank() != 0:
            return False
        row_tokens = self.row_tokens or int(totals["tokens"] / max(1, totals["microbatches"])
                                            / max(1, self.rows)) + 1
        self.say(report_text(why, totals, report, self.rows, row_tokens))
        return True

    def at_exit(self, owner: Any, why: str = "at exit") -> None:
        """Report at exit a run whose ``owner`` (the adapter's loader) is still alive then:
        one stopped by Ctrl-C or an error before its last step. The exit hook holds both
        weakly: a dropped loader frees its pipeline (and its worker processes) at once."""
        if not self.due:
            return
        atexit.register(_report_if_alive, weakref.ref(owner), weakref.ref(self), why)


def _report_if_alive(owner: weakref.ref, report: weakref.ref, why: str) -> None:
    alive = report()
    if owner() is not None and alive is not None:
        alive.print(why)


def report_text(why: str, totals: dict[str, float], report: PipelineReport, rows_per_mb: int,
                row_tokens: int) -> str:
    """The report: a header line (``totals`` of :class:`zephon.meter.LoaderMeter`) and the
    per-dataset table."""
    microbatches = int(totals["microbatches"])
    rows = microbatches * rows_per_mb
    inputs = max(1.0, totals["tokens"])
    tokens = rows * row_tokens
    wait = totals["wait_s"]
    rate = totals["tokens"] / wait if wait else float("inf")
    header = (f"zephon: end of run ({why}): {microbatches:,} microbatches, {rows:,} rows of "
              f"{row_tokens} tokens = {tokens:,} tokens (the model reads {row_tokens - 1} of "
              f"each row; the last is a label only), padding "
              f"{100 * report.padding_tokens / max(1, tokens):.2f}%, loss-bearing "
              f"{100 * totals['valid'] / inputs:.2f}% of the labels, loader "
              f"{1000 * wait / max(1, microbatches):.2f} ms/microbatch ({rate:,.0f} tokens/s "
              "when waited on)")
    return f"{header}\n{report}"


def job_report(report: PipelineReport, totals: dict[str, float],
               group: Any) -> tuple[PipelineReport, dict[str, float]]:
    """``report`` and ``totals`` summed over the readers of ``group`` (a host group; every
    reader must call this at the same point). Without a group, this rank's."""
    if group is None or not distributed():
        return report, totals
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return report, totals
    from zephon.distributed import gather_json

    gathered = gather_json({"report": dataclasses.asdict(report), "totals": totals}, group)
    # model-parallel peers read the same lanes: their figures count once
    parts = list({tuple(p["report"]["lanes"]): p for p in reversed(gathered)}.values())
    return merge_reports([_report_of(p["report"]) for p in parts]), {
        key: sum(p["totals"][key] for p in parts) for key in totals}


def _report_of(fields: dict[str, Any]) -> PipelineReport:
    datasets = [DatasetReport(**{**d, "skipped_files": tuple(d["skipped_files"])})
                for d in fields["datasets"]]
    return PipelineReport(**{**fields, "datasets": datasets, "lanes": tuple(fields["lanes"]),
                             "stages": []})


def _added(dicts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for entry in dicts:
        for key, value in entry.items():
            total[key] = total.get(key, 0) + value
    return total


def merge_reports(reports: list[PipelineReport]) -> PipelineReport:
    """The reports of readers owning different lanes of one run, as one."""
    first = reports[0]
    datasets = []
    for i, dataset in enumerate(first.datasets):
        same = [r.datasets[i] for r in reports]
        files = tuple(dict.fromkeys(f for d in same for f in d.skipped_files))
        datasets.append(DatasetReport(
            dataset.name, dataset.target_share, sum(d.documents for d in same),
            sum(d.tokens for d in same), sum(d.empty_documents for d in same), 0.0,
            _added([d.skipped for d in same]), files,
            sum(d.handed_documents for d in same), sum(d.handed_tokens for d in same)))
    unit = "handed_tokens" if first.mix_by == "tokens" else "handed_documents"
    total = sum(getattr(d, unit) for d in datasets) or 1
    for dataset in datasets:
        dataset.realized_share = getattr(dataset, unit) / total
    lanes = tuple(sorted({lane for r in reports for lane in r.lanes}))
    return PipelineReport(first.mix_by, datasets, sum(r.microbatches for r in reports),
                          sum(r.padding_tokens for r in reports),
                          _added([r.dropped for r in reports]),
                          _added([r.leftover for r in reports]),
                          all(r.finished for r in reports), lanes, first.total_lanes)
