"""Reading Hub datasets in tests: units read through the shard cache, a bound dataset, and a
worker process (``tests.hub.worker``) against the test Hub server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from zephon.io import Dataset
from zephon.io.formats import PlanHints, read_unit

HINTS = PlanHints(unit_bytes=2048, arrow_unit_rows=64)


def read_texts(dataset, min_units: int = 1) -> list[str]:
    """Every text of the dataset, read unit by unit through the shard cache."""
    files = dataset.files()
    texts = []
    for index, unit in dataset.plan(HINTS, min_units):
        data_file = files[index]
        with dataset.local_file(data_file) as local:
            columns, _ = read_unit(local, data_file.fmt, data_file.compression, unit, ["text"],
                                   dataset.display_name(data_file))
        texts.extend(columns["text"])
    return texts


def load(path: str, options, **kwargs):
    return Dataset.from_path("d", path, **kwargs).bound(options)


ROOT = Path(__file__).resolve().parents[2]


def hub_worker(args: dict, hub) -> subprocess.Popen:
    """``python -m tests.hub.worker ARGS`` against the Hub server ``hub``, from the repository
    root."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "NO_PROXY": "127.0.0.1,localhost",
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.hub.worker", json.dumps(args)],
                            cwd=ROOT, env=env)
