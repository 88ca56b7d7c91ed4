"""A job's plan saved to a file: ``zephon plan RECIPE --out FILE``, read by ``plan = FILE``.

The plan is what every rank needs to deal units to lanes: each dataset's files (path, size,
format, compression and version, :mod:`zephon.io.file_identity`'s for local files) and its
units as a :class:`~zephon.io.unit_table.UnitTable`, for one lane count. One process writes it; the
recipes of any number of jobs then name it (top-level ``plan = "FILE"``), and their ranks take
the listing and the units from it instead of listing and opening every file. Its fingerprint
is the data fingerprint of its datasets.

Layout: ``ZPLAN1\\n``, an 8-byte little-endian header length, a JSON header (version, lanes,
unit options, and per dataset its identity, files, skipped paths and where its unit table
lies), then the unit tables one after the other.

Checks: a dataset of the recipe that the plan does not hold, or holds with another path,
format, document range or unit option, and a run with another lane count are ConfigErrors
naming the field and the plan file. A file that changed since the plan was made (its size or
version) is a DataError naming the file when a rank reads it: the reader compares every file
with its listing before reading it. A plan of another ``VERSION`` (version 1 held tail-only
file versions, which no file matches now) is refused, asking for it to be made again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, DataError
from zephon.io.dataset import Dataset, decoded, encoded
from zephon.io.unit_table import UnitTable
from zephon.work.static_mixture import UNITS_PER_LANE

MAGIC = b"ZPLAN1\n"
VERSION = 2


def _identity(dataset: Dataset) -> dict[str, Any]:
    return {"name": dataset.name, "path": dataset.path, "fmt": dataset.fmt,
            "documents": list(dataset.documents) if dataset.documents else None}


def write_plan(source: Any, lanes: int, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Plan ``source`` (a StaticMixtureWorkSource) for ``lanes`` lanes and write it to
    ``out`` (atomically: a partial file is never left under that name). Returns the header."""
    tables = source.plan(lanes)
    entries, blobs, offset = [], [], 0
    for dataset, table in zip(source.datasets, tables, strict=True):
        if not dataset.job_shared:
            raise ConfigError(f"zephon plan: dataset {dataset.name!r} ({dataset.path}) shares "
                              "its own resolution across ranks and is not saved in a plan")
        blob = table.to_bytes()
        entries.append({**_identity(dataset),
                        "files": [encoded(f) for f in dataset.files()],
                        "skipped": list(dataset.skipped_files()),
                        "fingerprint": dataset.fingerprint(),
                        "units": [offset, len(blob)], "unit_count": len(table)})
        blobs.append(blob)
        offset += len(blob)
    header = {"version": VERSION, "lanes": lanes,
              "unit_options": [source.hints.unit_bytes, source.hints.arrow_unit_rows],
              "datasets": entries}
    text = json.dumps(header).encode()
    target = Path(out)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    with open(partial, "wb") as f:
        f.write(MAGIC + len(text).to_bytes(8, "little") + text)
        for blob in blobs:
            f.write(blob)
    os.replace(partial, target)
    return header


@dataclass(frozen=True)
class SavedPlan:
    """A plan read from a file (see the module docstring)."""

    path: str
    lanes: int
    unit_options: tuple[int, int]
    """(``unit_bytes``, ``arrow_unit_rows``) the units were cut with."""
    datasets: dict[str, dict[str, Any]]
    """Per dataset name: its header entry, with ``table`` (a UnitTable) added."""

    def adopt(self, dataset: Dataset) -> None:
        """Give ``dataset`` its listing and units from this plan, or raise a ConfigError
        naming what differs."""
        entry = self.datasets.get(dataset.name)
        if entry is None:
            raise ConfigError(f"plan {self.path}: has no dataset {dataset.name!r} (it holds "
                              f"{sorted(self.datasets)}); make it again with zephon plan")
        for key, value in _identity(dataset).items():
            if entry[key] != value:
                raise ConfigError(f"plan {self.path}: dataset {dataset.name!r} has {key} = "
                                  f"{entry[key]!r} there and {value!r} here; make the plan "
                                  "again with zephon plan")
        dataset.adopt_listing(tuple(decoded(f) for f in entry["files"]),
                              tuple(entry["skipped"]))
        dataset.adopt_units((*self.unit_options, UNITS_PER_LANE * self.lanes), entry["table"])

    def check(self, lanes: int | None, unit_options: tuple[int, int]) -> None:
        """A ConfigError unless a run of ``lanes`` lanes cutting units with ``unit_options``
        can use this plan."""
        if lanes is not None and lanes != self.lanes:
            raise ConfigError(f"plan {self.path} was made for {self.lanes} lanes and this run "
                              f"has {lanes}; make it again with zephon plan --lanes {lanes}")
        if tuple(unit_options) != self.unit_options:
            raise ConfigError(f"plan {self.path} cut units with [work] unit_bytes, "
                              f"arrow_unit_rows = {list(self.unit_options)} and this run with "
                              f"{list(unit_options)}; make it again with zephon plan")


def read_plan(path: str | os.PathLike[str]) -> SavedPlan:
    """The plan in ``path``; a file that is not one, or is cut short, is a DataError."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"plan file {str(path)!r} cannot be read ({exc.strerror}); write "
                          "it with zephon plan RECIPE --out FILE") from None
    if not data.startswith(MAGIC):
        raise DataError(f"{path}: not a zephon plan (write one with zephon plan)")
    start = len(MAGIC) + 8
    length = int.from_bytes(data[len(MAGIC):start], "little")
    try:
        header = json.loads(data[start:start + length])
    except ValueError as exc:
        raise DataError(f"{path}: damaged zephon plan header ({exc})") from None
    if header.get("version") != VERSION:
        raise DataError(f"{path}: zephon plan version {header.get('version')}, this zephon "
                        f"reads {VERSION}; make it again with zephon plan")
    body = memoryview(data)[start + length:]
    datasets = {}
    for entry in header["datasets"]:
        offset, size = entry["units"]
        if offset + size > len(body):
            raise DataError(f"{path}: cut short (dataset {entry['name']!r})")
        datasets[entry["name"]] = {**entry, "table": UnitTable.from_bytes(body[offset:offset
                                                                                 + size])}
    return SavedPlan(str(path), int(header["lanes"]), tuple(header["unit_options"]), datasets)
