"""Whether the training data lasts the run: rows the data yields, counted or estimated.

A dataset that does not repeat (``[mixture] repeat``) can run out before the run's last step,
and the trainer then stops with an error, often without a checkpoint. Each adapter knows the
rows its run consumes (Megatron's iterations with its batch-size ramp, TorchTitan's steps x
global batch); :func:`data_supply` gives the rows the data yields, and
:meth:`DataSupply.short_of` says whether that is too few, before the model is built.

The rule. The rows come from the tokens of the datasets that end the data
(``on_exhausted = "stop"``: the first non-repeated dataset to run out at its mixture share;
``"drain"``: all of them). Exact for one Megatron indexed dataset packed with ``wrap`` and no
``[[ops]]``: the tokens of each lane's units are counted from the ``.idx`` (plus the BOS/EOS a
``pretokenized`` operator adds per document; reading the index only), ``wrap`` pads only a
lane's last row, and every microbatch is handed out but fewer than one per data-parallel
rank (:func:`indexed_rows`): a run needing more rows is refused. Otherwise (text data, whose
tokens are estimated from a tokenized sample; several datasets; bin packing, which pads;
``[[ops]]`` that may drop or change documents) the rows are an estimate, tokens over the row
length over all lanes, and a run is refused only when that is below
:data:`SHORT_ESTIMATE` of what it needs. Remote datasets (``hf://``) are not estimated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHORT_ESTIMATE = 0.9
"""An estimated row count below this share of the rows a run needs is refused."""


@dataclass(frozen=True)
class DataSupply:
    """The rows the training data yields before it ends."""

    rows: int
    tokens: int
    """Tokens of the datasets that end the data."""
    exact: bool
    """Counted (one indexed dataset packed with ``wrap``), not estimated."""
    limiting: tuple[str, ...]
    """The datasets whose end ends the data."""
    once: tuple[str, ...]
    """The datasets that do not repeat."""
    lanes: int

    def short_of(self, needed: int) -> bool:
        """Whether a run consuming ``needed`` rows would run out of data."""
        return self.rows < needed if self.exact else self.rows < SHORT_ESTIMATE * needed

    def described(self, row: int) -> str:
        """The rows, and how they were found, for a message."""
        if self.exact:
            return (f"{self.rows:,} rows of {row} tokens ({self.tokens:,} tokens counted from "
                    f"the index, split over {self.lanes} lanes)")
        return f"about {self.rows:,} rows of {row} tokens (about {self.tokens:,} tokens, " \
               "estimated)"

    def shortfall(self, source: str, needs: str, fix_run: str, row: int) -> str:
        """The preflight's message: ``needs`` says what the run consumes, ``fix_run`` how to
        consume less."""
        which = ", ".join(repr(n) for n in self.limiting)
        one = len(self.limiting) == 1
        repeat = f"repeat = [{', '.join(repr(n) for n in self.once)}]".replace("'", '"')
        return (f"{source}: the training data runs out before the run ends: {needs}, but "
                f"{'dataset' if one else 'datasets'} {which} {'is' if one else 'are'} not "
                f"repeated and the data yields {self.described(row)}; training would stop "
                f"with an error, without a checkpoint. Add {repeat} to [mixture], give more "
                f"data, or {fix_run}")


def data_supply(recipe: Any, pipeline: Any, row: int, microbatch_size: int,
                dp_size: int) -> DataSupply | None:
    """The rows the training data of ``pipeline`` (built from ``recipe``, not iterated)
    yields at ``dp_size`` readers, ``row`` tokens a row; None where the data never ends or
    cannot be estimated here (see the module docstring)."""
    from zephon.ops.pretokenized import PretokenizedSpec

    source = pipeline.work_source
    names = list(source.names())
    once = [n for n, repeats in zip(names, source.repeated, strict=True) if not repeats]
    if not once or (source.on_exhausted == "drain" and len(once) < len(names)):
        return None  # every dataset repeats (or the repeating ones go on): endless
    if any("://" in str(e.path) for e in recipe.datasets if e.name in once):
        return None
    estimates = {e.name: e for e in pipeline.estimate()}
    tokens: dict[str, float] = {}
    for name in names:
        estimate = estimates[name]
        if estimate.tokens is None:
            return None
        extra = sum((spec.bos_token_id is not None) + (spec.eos_token_id is not None)
                    for spec in pipeline.operators if isinstance(spec, PretokenizedSpec)
                    and name in (getattr(spec, "datasets", None) or names))
        tokens[name] = estimate.tokens + extra * (estimate.documents or 0)
    exact = all(estimates[n].tokens_exact for n in names) and not (
        recipe.ops or recipe.ops_after_tokenize)
    shares = dict(zip(names, (float(w) for w in source.weights), strict=True))
    if source.on_exhausted == "drain":
        available, limiting = sum(tokens.values()), once
    else:
        if source.by_tokens:
            totals = {n: tokens[n] / shares[n] for n in once}
        else:  # documents: the documents read until it ends, at the mean tokens per document
            per_doc = sum(shares[n] * tokens[n] / max(1, estimates[n].documents or 1)
                          for n in names)
            totals = {n: (estimates[n].documents or 0) / shares[n] * per_doc for n in once}
        first = min(totals, key=totals.__getitem__)
        available, limiting = totals[first], [first]
        exact = exact and len(names) == 1
    exact = exact and recipe.pack is not None and recipe.pack.algorithm == "wrap"
    rows = indexed_rows(pipeline, row, microbatch_size, dp_size) if exact else \
        int(available / row)
    return DataSupply(rows, int(available), exact, tuple(limiting), tuple(once),
                      pipeline.lanes)


def indexed_rows(pipeline: Any, row: int, mbs: int, dp: int) -> int:
    """The rows one non-repeated indexed dataset, packed with ``wrap``, hands out at ``dp``
    data-parallel ranks: each lane's units
    (:meth:`~zephon.work.static_mixture.StaticMixtureWorkSource.unit_at`) give it ``T_l``
    tokens, so ``ceil(T_l / row)`` rows (only the last is padded) and ``k_l = rows // mbs``
    microbatches. Every one of them is handed out but the last ``(sum(k_l) - min(k_l) L) %
    dp``: the rounds end at ``min(k_l) L`` and the last round hands the rest out ``dp`` at a
    time (:mod:`zephon.engine.last_round`)."""
    from zephon.io.indexed import open_indexed
    from zephon.ops.pretokenized import PretokenizedSpec

    source = pipeline.work_source
    lanes = pipeline.lanes
    files = source.datasets[0].files()
    lengths = [open_indexed(f.path).document_lengths() for f in files]
    extra = sum((spec.bos_token_id is not None) + (spec.eos_token_id is not None)
                for spec in pipeline.operators if isinstance(spec, PretokenizedSpec))
    ends = []
    for lane in range(lanes):
        tokens, k = 0, 0
        while (found := source.unit_at(0, lane, k, lanes)) is not None:
            file_index, unit = found[2]
            tokens += int(lengths[file_index][unit.start:unit.stop].sum()) \
                + extra * (unit.stop - unit.start)
            k += 1
        ends.append((-(-tokens // row)) // mbs)
    last_round = sum(ends) - min(ends) * lanes
    return (sum(ends) - last_round % dp) * mbs
