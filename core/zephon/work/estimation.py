"""Token estimation: how many tokens each dataset holds, before reading it all.

Passing a ``TokenEstimation`` to the work source turns on mixing by tokens, which is exact
without any estimate (the mixer counts real tokens after tokenization). Its fields only shape
``Pipeline.estimate()``, which tells the user before training roughly how many documents and
tokens each dataset holds.

``primer="measure"`` tokenizes ``calibration_samples`` documents taken evenly from the first
``calibration_shards_max`` work units (in the seed's order) of each dataset and multiplies the
mean tokens per document by the document count (exact for Parquet and Arrow, extrapolated from
bytes for JSONL). ``primer="bytes"`` assumes 4 bytes of file per token and reads nothing; it is
rough for compressed files. ``Pipeline.estimate()`` runs it; iteration never waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.errors import ConfigError

PRIMERS = ("measure", "bytes")


@dataclass(frozen=True)
class TokenEstimation:
    """Turns on token-proportion mixing and says how dataset sizes are estimated."""

    primer: str = "measure"
    """``measure`` (tokenize a sample) or ``bytes`` (assume 4 bytes per token)."""
    calibration_samples: int = 2048
    """Documents tokenized per dataset by ``measure``."""
    calibration_shards_max: int = 4
    """Work units sampled per dataset by ``measure``."""

    def __post_init__(self) -> None:
        if self.primer not in PRIMERS:
            raise ConfigError(f"TokenEstimation: primer={self.primer!r} is not one of {PRIMERS}")
        if self.calibration_samples <= 0:
            raise ConfigError("TokenEstimation: calibration_samples must be positive")
        if self.calibration_shards_max <= 0:
            raise ConfigError("TokenEstimation: calibration_shards_max must be positive")


@dataclass(frozen=True)
class DatasetEstimate:
    """Estimated size of one dataset."""

    name: str
    documents: int | None
    tokens_per_document: float
    tokens: float | None
    documents_exact: bool = False
    """Whether ``documents`` is a count, not an estimate: rows of Parquet and Arrow files
    (from their metadata) and of Megatron indexes. JSON Lines counts are extrapolated."""
    tokens_exact: bool = False
    """Whether ``tokens`` is a count (Megatron indexes), not an estimate."""


def estimate_dataset(source: Any, index: int, lanes: int, columns: list[str] | None,
                     measure: Callable[[list[dict[str, Any]], list[str]], list[int]] | None,
                     spec: TokenEstimation) -> DatasetEstimate:
    """Estimate one dataset of ``source`` (a StaticMixtureWorkSource) for ``lanes`` lanes.

    ``measure`` gives the tokens of each sampled row (its fields, projected to ``columns``, and
    a label naming it); None (no tokenizer) estimates from bytes."""
    from zephon.io.formats import RowLabel, read_unit

    dataset = source.datasets[index]
    units = source.sampling_units(index, lanes)
    documents = units.rows()
    total_bytes = sum(f.size for f in dataset.files())
    if all(f.fmt == "megatron" for f in dataset.files()):
        return _indexed_counts(dataset, units)
    exact = documents is not None
    if spec.primer == "bytes" or measure is None:
        tokens = total_bytes / 4
        per_doc = tokens / documents if documents else float("nan")
        return DatasetEstimate(dataset.name, documents, per_doc, tokens, exact)
    order = source._unit_order(index, 0, len(units))
    sampled = [units[int(i)] for i in order[:spec.calibration_shards_max]]
    per_unit = -(-spec.calibration_samples // len(sampled))
    rows: list[dict[str, Any]] = []
    labels: list[Any] = []
    sampled_rows = 0
    sampled_bytes = 0
    for file_index, unit in sampled:
        data_file = dataset.files()[file_index]
        display = dataset.display_name(data_file)
        with dataset.local_file(data_file) as local:
            table, keys = read_unit(local, data_file.fmt, data_file.compression, unit,
                                    columns, display, data_file.context)
        step = max(1, len(keys) // per_unit)
        picked = list(range(0, len(keys), step))[:per_unit]
        rows += [{c: values[r] for c, values in table.items()} for r in picked]
        labels += [RowLabel(display, local, data_file.fmt, data_file.compression, keys[r])
                   for r in picked]
        sampled_rows += len(keys)
        sampled_bytes += unit.stop - unit.start if unit.kind == "bytes" else 0
    lengths = measure(rows, labels)
    per_doc = float(np.mean(lengths)) if lengths else 0.0
    if documents is None and sampled_bytes:
        documents = round(total_bytes * sampled_rows / sampled_bytes)
    tokens = per_doc * documents if documents is not None else None
    return DatasetEstimate(dataset.name, documents, per_doc, tokens, exact)


def _indexed_counts(dataset: Any, units: list[Any]) -> DatasetEstimate:
    """Exact documents and tokens of Megatron indexed datasets, from their indexes (not
    counting BOS/EOS that ``pretokenized`` may add)."""
    from zephon.io.indexed import open_indexed

    documents = tokens = 0
    for data_file in dataset.files():
        lengths = open_indexed(data_file.path).document_lengths()
        for file_index, unit in units:
            if dataset.files()[file_index] is data_file:
                documents += unit.stop - unit.start
                tokens += int(lengths[unit.start:unit.stop].sum())
    return DatasetEstimate(dataset.name, documents, tokens / documents if documents else 0.0,
                           float(tokens), True, True)
