"""MosaicML Streaming (MDS) and LitData shards written by the tests, pipelines over them and
their token rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon import Pipeline
from zephon.errors import DataError
from zephon.io import Dataset
from zephon.io.formats import PlanHints, read_unit
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MDS = Path(__file__).resolve().parents[1] / "data" / "mds"


EXPECTED = [json.loads(line) for line in (MDS / "expected.jsonl").read_text().splitlines()]


def rows_of(dataset: Dataset) -> list[dict]:
    """Every row of ``dataset``, unit by unit in plan order, as a dict of its fields."""
    table = dataset.plan(PlanHints(1 << 20, 7), 1)
    rows = []
    for i in range(len(table)):
        file_index, unit = table[i]
        data_file = dataset.files()[file_index]
        with dataset.local_file(data_file) as local:
            columns, keys = read_unit(local, data_file.fmt, data_file.compression, unit, None,
                                      data_file.path, data_file.context)
        rows += [{name: values[r] for name, values in columns.items()}
                 for r in range(len(keys))]
    return rows


def pipeline_over(path, tokenizer_dir, **options) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("d", path)], MixtureSpec({"d": 1.0}),
                                     seed=4, repeat=False, arrow_unit_rows=5)
    return (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(33, "wrap")
            .batch(2, drop_last=False).options(lanes=1, **options))


def token_rows(pipeline) -> list[bytes]:
    return [r.payload["input_ids"].tobytes() for b in pipeline for r in b.records]


def sorted_documents(path, tokenizer_dir) -> list[bytes]:
    """The token ids of every document of a dataset, one a row, sorted."""
    source = StaticMixtureWorkSource([Dataset.from_path("d", path)], MixtureSpec({"d": 1.0}),
                                     seed=4, repeat=False)
    pipeline = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).batch(1).options(lanes=1)
    return sorted(token_rows(pipeline))


def zstd_bomb(size: int) -> bytes:
    """``size`` zero bytes (whole MiB), zstd-compressed: a few hundred bytes a MiB."""
    import zstandard

    writer = zstandard.ZstdCompressor().compressobj()
    return b"".join([*(writer.compress(bytes(1 << 20)) for _ in range(size >> 20)),
                     writer.flush()])


def refused_peak(read, match: str) -> int:
    """The most memory ``read()`` held (as traced) before refusing with a DataError that
    matches ``match``."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=match):
            read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
