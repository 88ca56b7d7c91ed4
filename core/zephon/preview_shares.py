"""Mixture shares over a run: what ``zephon preview --shares`` shows.

:func:`share_windows` cuts the first ``tokens`` of a run into equal windows of tokens handed
to the trainer and gives, for each, the target share of every dataset (the schedule's
integral over the window divided by its width, so a ramp's window shows its mean) and,
where measured, the share the pipeline delivered in it: the recipe's one-rank pipeline is
run (its global microbatches are those of every data-parallel size) and each document
piece's tokens are counted in the window its microbatch falls in. Measuring costs a run of
``tokens`` tokens (measured: docs/measurements.md); targets alone cost nothing.

Windows count the tokens the trainer received, padding included; the lanes mix by what
their mixers handed on, so realized shares trail the targets by a few microbatches at a
boundary and windows as small as a microbatch or two are noisy (a document is not split
between datasets). Renderings: :func:`render_shares_terminal` (a table),
:func:`render_shares_png` (lines for targets, points for what was delivered; needs
matplotlib) and :func:`render_shares_html` (a table in a page).
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import ConfigError


@dataclass
class ShareWindow:
    """One window of a run's tokens."""

    begin: int
    end: int
    target: dict[str, float]
    """Each dataset's target share of the window's tokens."""
    delivered: dict[str, float] | None
    """Each dataset's share of the document tokens the window's microbatches held (None: not
    measured)."""


def share_windows(recipe_path: str | os.PathLike[str], tokens: int, windows: int = 20,
                  measure: bool = True, seq_len: int | None = None) -> list[ShareWindow]:
    """Target (and, with ``measure``, delivered) shares over the first ``tokens`` tokens of
    the recipe's run, in ``windows`` equal windows; see the module docstring."""
    from zephon.recipe import DataRecipe

    if tokens <= 0 or windows <= 0:
        raise ConfigError(f"--tokens and --windows must be positive, got {tokens} and "
                          f"{windows}")
    recipe = DataRecipe.from_toml(recipe_path)
    max_length = recipe.pack.max_length if recipe.pack is not None else None
    if seq_len is None:
        seq_len = max_length - 1 if max_length else 128
    pipeline = recipe.build(seq_len=seq_len, microbatch_size=recipe.batch.microbatch_size
                            or 1, dp_rank=0, dp_world_size=1,
                            lanes=None if recipe.lanes else 1, prefetch=0)
    schedule = pipeline.work_source.schedule
    edges = [round(tokens * i / windows) for i in range(windows + 1)]
    counts: list[dict[str, int]] = [{} for _ in range(windows)]
    if measure:
        position, window = 0, 0
        for batch in pipeline:
            while window < windows and position >= edges[window + 1]:
                window += 1
            if window >= windows:
                break
            for record in batch.records:
                for span in record.meta.get("documents", ()):
                    counts[window][span.dataset] = counts[window].get(span.dataset, 0) + \
                        int(span.length)
                position += len(record.payload["input_ids"])
        if position < tokens:
            raise ConfigError(f"{recipe.source}: the data ends after {position:,} tokens, "
                              f"before the {tokens:,} asked for (lower --tokens)")
    out = []
    names = schedule.names
    for i in range(windows):
        begin, end = edges[i], edges[i + 1]
        width = max(end - begin, 1)
        before, after = schedule.targets(begin), schedule.targets(end)
        target = {n: (b - a) / width for n, a, b in zip(names, before, after, strict=True)}
        delivered = None
        if measure:
            total = sum(counts[i].values())
            delivered = {n: counts[i].get(n, 0) / total if total else 0.0 for n in names}
        out.append(ShareWindow(begin, end, target, delivered))
    return out


def render_shares_terminal(windows: list[ShareWindow]) -> str:
    """One line a window: its token range, then each dataset's target (and delivered)
    share."""
    names = list(windows[0].target)
    header = f"{'tokens':>25}" + "".join(f"{n[:16]:>18}" for n in names)
    lines = [header, " " * 25 + "".join(f"{'target / got':>18}" for _ in names)]
    for w in windows:
        cells = []
        for n in names:
            got = f"{w.delivered[n]:.3f}" if w.delivered is not None else "-"
            cells.append(f"{w.target[n]:.3f} / {got}".rjust(18))
        lines.append(f"{w.begin:>12,}..{w.end:<11,}" + "".join(cells))
    return "\n".join(lines)


def render_shares_png(windows: list[ShareWindow], path: str | os.PathLike[str],
                      title: str = "") -> None:
    """Target shares as lines over the run's tokens, delivered shares as points."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise ConfigError("zephon preview --out *.png needs matplotlib: pip install "
                          "'zephon[viz]' (or write --out shares.html)") from None
    from zephon.preview import _PALETTE

    names = list(windows[0].target)
    middles = [(w.begin + w.end) / 2 for w in windows]
    figure, axes = pyplot.subplots(figsize=(9, 4.5))
    for i, name in enumerate(names):
        colour = _PALETTE[i % len(_PALETTE)]
        axes.plot(middles, [w.target[name] for w in windows], color=colour, label=name)
        if windows[0].delivered is not None:
            axes.scatter(middles, [w.delivered[name] for w in windows], color=colour, s=14)
    axes.set_xlabel("tokens handed to the trainer (line: target, points: delivered)")
    axes.set_ylabel("share of the window's tokens")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=8)
    axes.set_title(title or "mixture shares")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def render_shares_html(windows: list[ShareWindow], path: str | os.PathLike[str],
                       title: str = "") -> None:
    """The terminal table as a page."""
    names = list(windows[0].target)
    rows = ["<tr><th>tokens</th>" + "".join(f"<th>{html.escape(n)}<br>target / got</th>"
                                            for n in names) + "</tr>"]
    for w in windows:
        cells = "".join(
            f"<td>{w.target[n]:.3f} / "
            f"{f'{w.delivered[n]:.3f}' if w.delivered is not None else '-'}</td>"
            for n in names)
        rows.append(f"<tr><td>{w.begin:,}..{w.end:,}</td>{cells}</tr>")
    Path(path).write_text(f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}"
                          f"</title><h3>{html.escape(title)}</h3><table border=1 "
                          f"cellpadding=4>{''.join(rows)}</table>\n")
