"""``pack_flat`` and ``pack_sequences``: documents -> rows of at most ``max_length`` tokens.

Algorithms:

- ``wrap`` fills one row at a time and splits a document across rows when it does not fit; the
  tail continues in the next row with positions restarting at 0. Rows are full except the last
  one at a flush, which is padded: nothing is thrown away.
- ``first_fit`` / ``best_fit`` keep up to ``max_open_bins`` partially filled rows and put each
  document into the first (first_fit) or the tightest (best_fit) row it fits in, opening a new
  row otherwise; when more than ``max_open_bins`` rows are open the fullest is emitted, padded.
  Documents longer than ``max_length`` are cut into ``max_length`` pieces first. With 8 open
  bins and documents of 200-2000 words, padding stays a small share of the tokens (measured:
  docs/measurements.md); wrap has none but splits about one document per row.

A flat row carries ``input_ids`` and ``positions`` (int32; per-document positions restarting at 0,
padding forming its own run from 0), ``train_mask`` when any document carries one (chat data),
and meta ``documents`` (every contributing piece as a DocSpan) and ``padding``. ``pack_sequences``
keeps the documents of a row as a list instead (``to_training`` refuses such rows).

State between rows is the open rows themselves, so a snapshot holds at most
``max_open_bins * max_length`` tokens per lane. Rows already made wait in the node for their
microbatch: after a document of ``n`` tokens that is up to ``n / max_length`` rows, so cap
document length (``tokenize(max_document_tokens=...)``) to bound checkpoints on corpora with
very long documents.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError
from zephon.field_checks import (
    StateFieldError,
    doc_from_state,
    item,
    need_counts,
    need_fields,
    need_int,
    need_list,
    within,
)
from zephon.ops.base import BufferedNode, BuildContext, Node, OperatorSpec, RowOperator
from zephon.records import Doc, DocSpan, Record

ALGORITHMS = ("wrap", "first_fit", "best_fit")
MAX_ROW_TOKENS = 1 << 24
"""The longest row packed: 16.8M tokens, above the longest context any model trains on, and
64 MiB of int32 ids per open bin. It stops a typo from sizing buffers in terabytes."""


@dataclass(frozen=True)
class PackSpec(OperatorSpec):
    """Options of ``pack_flat`` / ``pack_sequences``."""

    title: ClassVar[str] = "packing"
    stage: ClassVar[str] = "row"
    needs_tokens: ClassVar[bool] = True
    makes_rows: ClassVar[bool] = True
    holes: ClassVar[tuple[str, ...]] = ("max_length",)

    max_length: int | None
    """Tokens per row. For next-token training pack to context length + 1. None: open, for
    the framework to fill (a recipe's ``[pack]`` without it, see
    :meth:`zephon.recipe.DataRecipe.resolve`); an open spec cannot be built."""
    algorithm: str = "wrap"
    """``wrap`` (split documents, no padding), ``first_fit`` or ``best_fit`` (pad, never split
    a document that fits in a row)."""
    pad_token_id: int | None = None
    """Token used for padding. None: the tokenizer's pad token, else its EOS, else 0."""
    max_open_bins: int = 8
    """Rows kept open by the bin-packing algorithms."""
    flat: bool = True
    """True for pack_flat (one token array per row), False for pack_sequences."""

    def __post_init__(self) -> None:
        op = "pack_flat" if self.flat else "pack_sequences"
        if self.max_length is not None and (not isinstance(self.max_length, int)
                                            or isinstance(self.max_length, bool)
                                            or self.max_length < 2):
            raise ConfigError(f"{op}: max_length must be an integer >= 2, got {self.max_length!r}")
        if self.max_length is not None and self.max_length > MAX_ROW_TOKENS:
            raise ConfigError(f"{op}: max_length = {self.max_length} is more than "
                              f"{MAX_ROW_TOKENS} tokens, the longest row zephon packs")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"{op}: algorithm={self.algorithm!r} is not one of {ALGORITHMS}")
        if not isinstance(self.max_open_bins, int) or self.max_open_bins <= 0:
            raise ConfigError(f"{op}: max_open_bins must be positive, got {self.max_open_bins}")
        if not self.flat and self.pad_token_id is not None:
            raise ConfigError("pack_sequences: pad_token_id does not apply (rows are not padded)")

    @property
    def op_name(self) -> str:  # type: ignore[override]
        return "pack_flat" if self.flat else "pack_sequences"

    def build(self, context: BuildContext) -> PackOperator:
        self.check_filled()
        special = context.special
        candidates = (self.pad_token_id, special.pad if special else None,
                      special.eos if special else None)
        return PackOperator(self, next((p for p in candidates if p is not None), 0))


@dataclass(frozen=True)
class PackFlatSpec(PackSpec):
    """``pack_flat``: :class:`PackSpec` with one token array per row."""

    op_name: ClassVar[str] = "pack_flat"  # type: ignore[misc]
    flat: bool = dataclasses.field(default=True, init=False)


@dataclass(frozen=True)
class PackSequencesSpec(PackSpec):
    """``pack_sequences``: :class:`PackSpec` with each row kept as its documents' token lists
    (never padded, so no ``pad_token_id``)."""

    op_name: ClassVar[str] = "pack_sequences"  # type: ignore[misc]
    pad_token_id: int | None = dataclasses.field(default=None, init=False)
    flat: bool = dataclasses.field(default=False, init=False)


class PackOperator(RowOperator):
    """:class:`PackSpec` with its padding token resolved against the tokenizer."""

    def __init__(self, spec: PackSpec, pad_token_id: int):
        super().__init__(spec)
        self.spec: PackSpec = spec
        self.pad_token_id = int(pad_token_id)

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "pad_token_id": self.pad_token_id}

    def node(self, upstream: Node, lane: int) -> PackNode:
        return PackNode(upstream, Packer(self.spec, self.pad_token_id, lane))


class PackNode(BufferedNode):
    """Pulls documents until a row is ready; at the end of its input it emits the open rows."""

    algorithm: Packer

    def algorithm_snapshot(self) -> dict[str, Any]:
        return {"packer": self.algorithm.snapshot(),
                "stats": {"padding_tokens": self.algorithm.padding_tokens}}

    def algorithm_restore(self, state: dict[str, Any]) -> None:
        state = need_fields(state, "", ("packer", "stats", "out", "ended"))
        stats = need_counts(state["stats"], "stats", ("padding_tokens",))
        with within("packer"):
            self.algorithm.restore(state["packer"])
        packer = self.algorithm
        if stats["padding_tokens"] != packer.padding_tokens:
            raise StateFieldError("stats.padding_tokens",
                                  f"is {stats['padding_tokens']}, but packer.padding_tokens "
                                  f"is {packer.padding_tokens}: both count the same padding")
        if state["ended"] and packer.open_rows():
            raise StateFieldError("packer.bins", f"holds {packer.open_rows()} open row(s), but "
                                                 "ended is true: open rows are emitted when "
                                                 "the input ends")

    def check_output(self, record: Record, path: str) -> None:
        """A row this packer made: one of this lane and, for ``pack_flat``, ``max_length``
        int32 tokens and positions, its documents laid end to end from the start and the rest
        padding."""
        if record.meta.get("lane") != self.algorithm.lane:
            raise StateFieldError(f"{path}.meta.lane", f"is {record.meta.get('lane')!r}, but "
                                                       f"this is lane {self.algorithm.lane}")
        if not self.algorithm.spec.flat:
            return
        size = self.algorithm.spec.max_length
        spans = record.meta.get("documents")
        if spans is None:
            raise StateFieldError(f"{path}.meta.documents", "is missing from a packed row")
        for name in ("input_ids", "positions"):
            value = record.payload.get(name)
            if not (isinstance(value, np.ndarray) and value.dtype == np.int32
                    and value.shape == (size,)):
                raise StateFieldError(f"{path}.payload.{name}",
                                      f"must be {size} int32 values (max_length), as "
                                      "packed rows are")
        offset = 0
        for i, span in enumerate(spans):
            if span.row_start != offset:
                raise StateFieldError(item(f"{path}.meta.documents", i),
                                      f"starts at {span.row_start}, but the documents before "
                                      f"it end at {offset}")
            offset += span.length
        if record.meta.get("padding") != size - offset:
            raise StateFieldError(f"{path}.meta.padding",
                                  f"is {record.meta.get('padding')!r}, but the row's "
                                  f"documents leave {size - offset} tokens of padding")


_Segment = tuple[Doc, int, int]  # (doc, start inside doc.tokens, length)


class Packer:
    """The packing algorithm for one lane (see the module docstring)."""

    def __init__(self, spec: PackSpec, pad_token_id: int, lane: int):
        self.spec = spec
        self.pad = int(pad_token_id)
        self.lane = lane
        self.rows_made = 0
        self.padding_tokens = 0
        self._bins: list[list[_Segment]] = []
        self._used: list[int] = []
        self._arange = np.arange(spec.max_length, dtype=np.int32)

    # -- state -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "bins": [[[_piece_state(d, s, n), 0, n] for d, s, n in b] for b in self._bins],
            "rows_made": self.rows_made,
            "padding_tokens": self.padding_tokens,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, refused unless every open row holds pieces of tokenized
        documents that fill it to less than ``max_length`` (a full row is emitted at once),
        and there are no more open rows than the algorithm keeps (1 for wrap)."""
        state = need_fields(state, "", ("bins", "rows_made", "padding_tokens"))
        bins = need_list(state["bins"], "bins")
        most = 1 if self.spec.algorithm == "wrap" else self.spec.max_open_bins
        if len(bins) > most:
            raise StateFieldError("bins", f"holds {len(bins)} open rows; "
                                          f"algorithm={self.spec.algorithm!r} keeps at most "
                                          f"{most}")
        restored = [self._bin_from_state(b, item("bins", i)) for i, b in enumerate(bins)]
        self.rows_made = need_int(state["rows_made"], "rows_made")
        self.padding_tokens = need_int(state["padding_tokens"], "padding_tokens")
        self._bins = restored
        self._used = [sum(n for _, _, n in b) for b in restored]

    def open_rows(self) -> int:
        """Rows begun and not emitted."""
        return sum(1 for b in self._bins if b)

    def _bin_from_state(self, value: Any, path: str) -> list[_Segment]:
        segments = []
        used = 0
        for i, part in enumerate(need_list(value, path)):
            where = item(path, i)
            doc_state, start, length = need_list(part, where, 3)
            doc = doc_from_state(doc_state, item(where, 0))
            start = need_int(start, item(where, 1))
            length = need_int(length, item(where, 2), low=1)
            if start + length > len(doc.tokens):
                raise StateFieldError(item(where, 2), f"is {length}, but the piece holds "
                                                      f"{len(doc.tokens) - start} tokens "
                                                      f"from {start}")
            used += length
            segments.append((doc, start, length))
        if used >= self.spec.max_length:
            raise StateFieldError(path, f"holds {used} tokens, but an open row holds fewer "
                                        f"than max_length={self.spec.max_length}")
        return segments

    # -- packing ---------------------------------------------------------------------------
    def add(self, doc: Doc) -> list[Record]:
        if self.spec.algorithm == "wrap":
            return self._add_wrap(doc)
        return self._add_binned(doc)

    def flush(self) -> list[Record]:
        rows = [self._emit(b) for b in self._bins if b]
        self._bins, self._used = [], []
        return rows

    def _add_wrap(self, doc: Doc) -> list[Record]:
        size = self.spec.max_length
        if not self._bins:
            self._bins, self._used = [[]], [0]
        total = len(doc.tokens)
        used = self._used[0]
        if used + total < size:  # the common case: the document ends inside the open row
            self._bins[0].append((doc, 0, total))
            self._used[0] = used + total
            return []
        rows = []
        start = 0
        while start < total:
            take = min(size - self._used[0], total - start)
            self._bins[0].append((doc, start, take))
            self._used[0] += take
            start += take
            if self._used[0] == size:
                rows.append(self._emit(self._bins[0]))
                self._bins, self._used = [[]], [0]
        return rows

    def _add_binned(self, doc: Doc) -> list[Record]:
        size = self.spec.max_length
        rows = []
        for start in range(0, len(doc.tokens), size):
            length = min(size, len(doc.tokens) - start)
            target = self._choose_bin(length)
            if target is None:
                self._bins.append([])
                self._used.append(0)
                target = len(self._bins) - 1
            self._bins[target].append((doc, start, length))
            self._used[target] += length
            if self._used[target] == size:
                rows.append(self._pop(target))
            elif len(self._bins) > self.spec.max_open_bins:
                fullest = max(range(len(self._bins)), key=lambda i: (self._used[i], -i))
                rows.append(self._pop(fullest))
        return rows

    def _choose_bin(self, length: int) -> int | None:
        room = self.spec.max_length - length
        fits = [i for i, used in enumerate(self._used) if used <= room]
        if not fits:
            return None
        if self.spec.algorithm == "first_fit":
            return fits[0]
        return min(fits, key=lambda i: (room - self._used[i], i))

    def _pop(self, index: int) -> Record:
        segments = self._bins.pop(index)
        self._used.pop(index)
        return self._emit(segments)

    def _emit(self, segments: list[_Segment]) -> Record:
        """One row of ``segments``: for ``pack_flat`` the tokens copied once into the row's
        array and the positions into another (a slice assignment a segment), then padding."""
        size = self.spec.max_length
        row_id = f"lane{self.lane}/row{self.rows_made}"
        self.rows_made += 1
        masked = False
        spans = []
        offset = 0
        for doc, start, length in segments:
            spans.append(DocSpan(doc.doc_id, doc.dataset, doc.doc_start + start, offset, length))
            offset += length
            if doc.train_mask is not None:
                masked = True
        if not self.spec.flat:
            meta = {"id": row_id, "lane": self.lane, "documents": tuple(spans), "padding": 0,
                    "packed_sequences": True}
            payload = {"documents": [doc.tokens[s:s + n] for doc, s, n in segments]}
            if masked:
                payload["train_masks"] = [_mask_of(doc, s, n) for doc, s, n in segments]
            return Record(payload, meta)
        padding = size - offset
        self.padding_tokens += padding
        arange = self._arange
        ids = np.empty(size, dtype=np.int32)
        positions = np.empty(size, dtype=np.int32)
        offset = 0
        for doc, start, length in segments:
            end = offset + length
            ids[offset:end] = doc.tokens[start:start + length]
            positions[offset:end] = arange[:length]
            offset = end
        if padding:
            ids[offset:] = self.pad
            positions[offset:] = arange[:padding]
        payload = {"input_ids": ids, "positions": positions}
        if masked:
            masks = [_mask_of(doc, s, n) for doc, s, n in segments]
            if padding:
                masks.append(np.zeros(padding, dtype=bool))
            payload["train_mask"] = np.concatenate(masks)
        meta = {"id": row_id, "lane": self.lane, "documents": tuple(spans), "padding": padding}
        return Record(payload, meta)


def _mask_of(doc: Doc, start: int, length: int) -> np.ndarray:
    if doc.train_mask is None:
        return np.ones(length, dtype=bool)
    return doc.train_mask[start:start + length]


def _piece_state(doc: Doc, start: int, length: int) -> list[Any]:
    """Only the piece of a document that sits in an open row: a checkpoint holds at most
    ``max_open_bins * max_length`` tokens of open rows, however long the documents."""
    mask = doc.train_mask[start:start + length] if doc.train_mask is not None else None
    return Doc(doc.tokens[start:start + length], doc.doc_id, doc.dataset,
               doc.doc_start + start, mask).to_plain()

