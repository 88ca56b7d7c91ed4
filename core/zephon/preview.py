"""A picture of a batch: what ``zephon preview`` shows.

:func:`first_batch` builds a recipe's pipeline and takes its first microbatch through
``to_training`` with the recipe's own options; :class:`RowView` lays each row out token by
token: the document each token belongs to, padding, labels that carry no loss, position resets
and ``cu_seqlens`` boundaries. Three renderings:

- :func:`render_png`: one band per row, documents as coloured spans, padding hatched, tokens
  whose label is ignored marked underneath, position resets (white) and cu_seqlens boundaries
  (dashed) drawn; needs matplotlib (``pip install zephon[viz]``);
- :func:`render_html`: the same as a self-contained page with the decoded tokens;
- :func:`render_terminal`: ANSI colours and decoded tokens, for a terminal.

Tokens are shown as the tokenizer decodes them (:func:`token_texts`), not as vocabulary
pieces (``Ġthe``, ``▁the``, ``<0xE2>``), and every view names each document's dataset.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac"]
_ANSI = [24, 130, 28, 124, 30, 136, 90, 168, 94, 102]


@dataclass
class RowView:
    """One row of a microbatch, token by token."""

    row_id: str
    tokens: np.ndarray
    """Input token ids."""
    text: list[str]
    """Each token decoded (or its id when the recipe has no tokenizer)."""
    document: np.ndarray
    """Index of the document piece each token belongs to in this row; -1 for padding."""
    names: list[str]
    """The document ids of the pieces, in row order."""
    datasets: list[str]
    """The dataset of each piece, in row order."""
    positions: np.ndarray
    ignored: np.ndarray
    """True where the label of this position carries no loss."""
    boundaries: list[int]
    """cu_seqlens boundaries inside the row."""


def first_batch(recipe_path: str | os.PathLike[str], rows: int = 4,
                seq_len: int | None = None, preset: Any = None) -> list[RowView]:
    """The first ``rows`` rows of the recipe's first microbatch, laid out; with ``preset``
    (:mod:`zephon.recipe.presets`), as that framework's adapter completes the recipe's
    ``[to_training]``."""
    import dataclasses

    from zephon.recipe import DataRecipe

    recipe = DataRecipe.from_toml(recipe_path, preset=preset)
    if preset is not None:
        recipe = dataclasses.replace(recipe, to_training=preset.applied(recipe.to_training))
    max_length = recipe.pack.max_length if recipe.pack is not None else None
    if seq_len is None:
        seq_len = max_length - 1 if max_length else 128
    pipeline = recipe.build(seq_len=seq_len, microbatch_size=recipe.batch.microbatch_size
                            or rows, dp_rank=0, dp_world_size=1,
        lanes=None if recipe.lanes else 1, prefetch=0)
    batch = next(iter(pipeline), None)
    if batch is None:
        raise ConfigError(f"{recipe.source}: the recipe yields no microbatch")
    options = {k: v for k, v in recipe.training_options().items()
               if k not in ("rename_fields", "exclude_fields", "flatten",
                            "return_num_valid_tokens")}
    out = batch.to_training(**{**options, "return_labels": True, "return_padding_mask": True,
                               "return_cu_seqlens": True, "flatten": False})
    decode = _decoder(recipe.tokenizer)
    ignore = options.get("ignore_index", -100)
    views = []
    for r, record in enumerate(batch.records[:rows]):
        inputs = out["input_ids"][r].numpy()
        document = np.full(len(inputs), -1, dtype=np.int64)
        spans = record.meta.get("documents", ())
        for i, span in enumerate(spans):
            document[span.row_start:min(span.row_start + span.length, len(inputs))] = i
        cu = [int(c) for c in out["cu_seqlens"][r].tolist() if c >= 0]
        views.append(RowView(record.meta.get("id", str(r)), inputs, decode(inputs), document,
                             [s.doc_id for s in spans], [s.dataset for s in spans],
                             out["positions"][r].numpy(), out["labels"][r].numpy() == ignore,
                             cu[1:-1]))
    return views


def _decoder(tokenizer: str | None) -> Any:
    if tokenizer is None:
        return lambda ids: [str(int(i)) for i in ids]
    from zephon.text.tokenizer import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is not None:
        def decode(ids: list[int]) -> str:
            return backend.decode(ids, skip_special_tokens=False)
    else:
        def decode(ids: list[int]) -> str:
            return loaded.decode(ids, skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)
    return lambda ids: token_texts([int(i) for i in ids], decode)


def token_texts(ids: list[int], decode: Any) -> list[str]:
    """The text each token adds to the decoded row: ``decode(ids[j:i+1])`` past
    ``decode(ids[j:i])``, with ``j`` the token before (so a decoder that drops a leading space
    at the start of a text, as SentencePiece's does, keeps it here). A token that ends inside a
    character (byte-level BPE and byte fallback split one across tokens) shows nothing, and
    the token that completes the character shows all of it. Two decodes per token: a preview
    row of 4,096 tokens takes a few milliseconds."""
    out: list[str] = []
    start = 0  # first token whose text is not shown yet
    for i in range(len(ids)):
        context = max(0, start - 1)
        before = decode(ids[context:start]) if context < start else ""
        text = decode(ids[context:i + 1])
        if text.endswith("\ufffd") and i + 1 < len(ids) and i - start < 3:
            out.append("")  # a character continues in the next token
            continue
        out.append(text[len(before):] if text.startswith(before) else decode(ids[start:i + 1]))
        start = i + 1
    return out


def render_png(rows: list[RowView], path: str | os.PathLike[str], title: str = "") -> None:
    """One band per row; see the module docstring."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
        from matplotlib.colors import to_rgb
        from matplotlib.patches import Rectangle
    except ImportError:
        raise ConfigError("zephon preview --out *.png needs matplotlib: pip install "
                          "'zephon[viz]' (or write --out batch.html)") from None
    width = max(len(r.tokens) for r in rows)
    image = np.ones((len(rows), width, 3))
    for y, row in enumerate(rows):
        for x, doc in enumerate(row.document):
            image[y, x] = (0.86, 0.86, 0.86) if doc < 0 else to_rgb(_PALETTE[doc % 10])
    figure, axes = pyplot.subplots(figsize=(max(8.0, width / 24), 0.9 * len(rows) + 1.2))
    axes.imshow(image, aspect="auto", interpolation="nearest",
                extent=(0, width, len(rows), 0))
    for y, row in enumerate(rows):
        padding = np.flatnonzero(row.document < 0)
        if padding.size:
            axes.add_patch(Rectangle((padding[0], y), padding.size, 1, fill=False,
                                     hatch="///", edgecolor="#555555", linewidth=0))
        resets = np.flatnonzero(row.positions == 0)
        axes.vlines(resets[resets > 0], y, y + 1, colors="white", linewidth=1.5)
        axes.vlines(row.boundaries, y, y + 1, colors="black", linewidth=0.8,
                    linestyles="dashed")
        for start in np.flatnonzero(np.diff(row.document, prepend=-2) != 0):
            doc = int(row.document[start])
            if doc >= 0:
                axes.text(start + 0.3, y + 0.35, row.datasets[doc], fontsize=6, color="white",
                          clip_on=True)
        ignored = np.flatnonzero(row.ignored)
        axes.scatter(ignored + 0.5, np.full(ignored.size, y + 0.85), marker="x", s=6,
                     c="black", linewidths=0.6)
    axes.set_yticks(np.arange(len(rows)) + 0.5, [r.row_id for r in rows])
    axes.set_xlabel("token position   x: label ignored   white: position reset   dashed: "
                    "cu_seqlens   hatched: padding", fontsize=8)
    axes.set_title(title or "first microbatch")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def render_html(rows: list[RowView], path: str | os.PathLike[str], title: str = "") -> None:
    """A self-contained page: each token a coloured span, decoded, with its details."""
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:monospace}.row{margin:1em 0;line-height:1.9}"
             "span{padding:1px;margin:0 1px;border-radius:2px;color:white}"
             ".pad{background:repeating-linear-gradient(45deg,#ccc,#ccc 3px,#fff 3px,#fff 6px);"
             "color:#555}.ign{text-decoration:underline wavy black}"
             ".reset{border-left:3px solid black}</style>",
             f"<h1>{html.escape(title or 'first microbatch')}</h1>",
             "<p>colour: document; striped: padding; wavy underline: label ignored; bar: "
             "position reset</p>"]
    for row in rows:
        legend = ", ".join(f"<span style='background:{_PALETTE[i % 10]}'>{i}</span> "
                           f"{html.escape(d)}" for i, d in enumerate(row.datasets))
        parts.append(f"<div class='row'><b>{html.escape(row.row_id)}</b> documents: "
                     f"{legend}<br>")
        for x, text in enumerate(row.text):
            doc = int(row.document[x])
            classes = ["pad" if doc < 0 else ""]
            classes += ["ign"] if row.ignored[x] else []
            classes += ["reset"] if row.positions[x] == 0 and x > 0 else []
            style = "" if doc < 0 else f" style='background:{_PALETTE[doc % 10]}'"
            tip = (f"token {int(row.tokens[x])} position {int(row.positions[x])}"
                   + (f" document {row.names[doc]} of {row.datasets[doc]}" if doc >= 0
                      else " padding"))
            parts.append(f"<span class='{' '.join(c for c in classes if c)}'{style} "
                         f"title='{html.escape(tip)}'>{html.escape(text)}</span>")
        parts.append("</div>")
    Path(path).write_text("".join(parts))


def render_terminal(rows: list[RowView], limit: int = 96) -> str:
    """ANSI colours per document, decoded tokens; the first ``limit`` tokens of each row."""
    lines = ["colour: document; dim dots: padding; underlined: label ignored; |: position "
             "reset; ↵ newline, → tab"]
    for row in rows:
        legend = ", ".join(f"\x1b[48;5;{_ANSI[i % 10]}m\x1b[97m {i} \x1b[0m {dataset}"
                           for i, dataset in enumerate(row.datasets))
        lines.append(f"{row.row_id} documents: {legend}")
        pieces = []
        for x, text in enumerate(row.text[:limit]):
            text = text.replace("\n", "↵").replace("\t", "→")
            doc = int(row.document[x])
            if doc < 0:
                pieces.append("\x1b[2m·\x1b[0m")
                continue
            reset = "|" if row.positions[x] == 0 and x > 0 else ""
            underline = "\x1b[4m" if row.ignored[x] else ""
            pieces.append(f"{reset}\x1b[48;5;{_ANSI[doc % 10]}m\x1b[97m{underline}"
                          f"{text}\x1b[0m")
        more = len(row.text) - limit
        lines.append(f"{row.row_id}: " + "".join(pieces)
                     + (f" ... (+{more} tokens)" if more > 0 else ""))
    return "\n".join(lines)
