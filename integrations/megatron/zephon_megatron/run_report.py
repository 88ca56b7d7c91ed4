"""The end-of-run report of a Megatron run: what the whole job's training readers handed out.

Each data-parallel reader knows only its own lanes (:meth:`Pipeline.report`). At the end of
training every reader of a pipeline stage reaches the same point together: the microbatch
that completes ``--train-iters`` (or ``--train-samples``), or the end of the data, which the
readers agree on. There :func:`job_report` gathers the readers' reports over their
data-parallel group and adds them up: documents, tokens, skipped rows and padding per dataset,
microbatches, drops and leftovers; the realized shares are recomputed from the summed
amounts. The reports travel as JSON text in a byte tensor (two ``all_gather`` calls over the
host group: lengths, then bytes), never as pickled objects.

A run stopped otherwise (Ctrl-C, an error, Megatron's ``--exit-interval``) has no such common
point, and a collective there could wait for a rank that is gone: its report is this rank's
lanes, and says so.

The header counts on the table's basis: rows of ``seq_length + 1`` tokens, of which the model
reads the first ``seq_length`` as inputs and the last is a label only. It says both, so the
header's tokens are the table's (documents plus padding).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from zephon.report import DatasetReport, PipelineReport


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
    import torch.distributed as dist

    if group is None or not (dist.is_available() and dist.is_initialized()) \
            or dist.get_world_size(group) == 1:
        return report, totals
    mine = json.dumps({"report": dataclasses.asdict(report), "totals": totals})
    gathered = _all_gather_text(mine, group)
    parts = [json.loads(text) for text in gathered]
    return merge_reports([_report_of(p["report"]) for p in parts]), {
        key: sum(p["totals"][key] for p in parts) for key in totals}


def _all_gather_text(text: str, group: Any) -> list[str]:
    import torch
    import torch.distributed as dist

    data = torch.tensor(list(text.encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(buffers, padded, group=group)
    return [bytes(b[:int(s.item())].tolist()).decode() for b, s in zip(buffers, sizes,
                                                                      strict=True)]


def _report_of(fields: dict[str, Any]) -> PipelineReport:
    datasets = [DatasetReport(**{**d, "skipped_files": tuple(d["skipped_files"])})
                for d in fields["datasets"]]
    return PipelineReport(**{**fields, "datasets": datasets, "lanes": tuple(fields["lanes"])})


def _added(dicts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for entry in dicts:
        for key, value in entry.items():
            total[key] = total.get(key, 0) + value
    return total


def merge_reports(reports: list[PipelineReport]) -> PipelineReport:
    """The reports of readers owning different lanes of one run, as one (see the module
    docstring)."""
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
