"""A job's plan saved to a file: ``zephon plan RECIPE --out FILE``, read by ``plan = FILE``.

The plan is what every rank needs to deal units to lanes: each dataset's files (path, size,
format, compression and version: :mod:`zephon.io.file_identity`'s for local files) and its
units as a :class:`~zephon.io.unit_table.UnitTable`, for one lane count. One process writes
it; the recipes of any number of jobs then name it (top-level ``plan = "FILE"``), and their
ranks take the listing and the units from it instead of listing and opening every file. Its
fingerprint is the data fingerprint of its datasets.

Layout: ``ZPLAN2\\n``, an 8-byte little-endian header length, a JSON header, then the unit
tables one after the other. The header is a sealed artifact (:mod:`zephon.artifacts`): its
kind, its SHA-256, and the SHA-256 and length of the body, so a plan changed or damaged
anywhere after it was written is refused before anything in it is used.

A plan is a manifest, and nothing in it is believed: the header's fields are checked as
:func:`read_plan` reads them (types, ranges, where each dataset's tables lie), and as a
dataset adopts its part (:meth:`SavedPlan.adopt`) every file must lie under the dataset's
path and every unit within its file: a known file and kind, and the units of one file (of one
row group) following each other without gap or overlap from its start to its end where the
listing knows the end (a Parquet group's rows, a JSON Lines file's bytes). A duplicated,
dropped or moved unit, or a file of another dataset, is an :class:`~zephon.artifacts.
ArtifactError` naming the plan, the dataset and the field.

What changed since: a dataset that adopts a plan lists the names under its path (no file is
opened) once per job, and says once when the folder holds files the plan lacks (they are not
read). ``zephon check`` compares the plan with a full listing and names every file added,
missing or changed (:func:`plan_changes`). A file that changed since the plan was made (size
or version) is also a DataError naming it when a rank reads it.

Checks against the run: a dataset of the recipe that the plan does not hold, or holds with
another path, format, document range or unit option, and a run with another lane count are
ConfigErrors naming the field and the plan file. A plan of version 1 (no checksum, and file
versions of each file's last 4 KiB only, which no file matches now) is refused, asking for it
to be made again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon.artifacts import ArtifactError, digest, opened, sealed
from zephon.distributed import first_rank
from zephon.errors import ConfigError, DataError
from zephon.field_checks import (
    MAX_COUNT,
    StateFieldError,
    item,
    join,
    need_fields,
    need_int,
    need_list,
    need_str,
    within,
)
from zephon.io.dataset import DataFile, Dataset, decoded, encoded
from zephon.io.formats.registry import known_formats
from zephon.io.unit_table import KINDS, UnitTable
from zephon.logs import get_logger
from zephon.work.static_mixture import units_per_lane

log = get_logger(__name__)

MAGIC = b"ZPLAN2\n"
OLD_MAGIC = b"ZPLAN1\n"
VERSION = 2
KIND = "zephon.plan"
MAX_HEADER_BYTES = 1 << 31
"""A header longer than this is refused before it is parsed (a listing of 100,000 files
takes about 20 MB)."""

_DATASET_FIELDS = ("name", "path", "fmt", "documents", "files", "skipped", "fingerprint",
                   "units", "unit_count", "min_units")


def _identity(dataset: Dataset) -> dict[str, Any]:
    return {"name": dataset.name, "path": dataset.path, "fmt": dataset.fmt,
            "documents": list(dataset.documents) if dataset.documents else None}


def _min_units(source: Any, dataset: Dataset, lanes: int) -> int:
    """The least units ``source`` cuts ``dataset`` into for ``lanes`` lanes."""
    repeated = source.repeated[[d.name for d in source.datasets].index(dataset.name)]
    return units_per_lane(repeated, dataset.files()) * lanes


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
                        "units": [offset, len(blob)], "unit_count": len(table),
                        "min_units": _min_units(source, dataset, lanes)})
        blobs.append(blob)
        offset += len(blob)
    body = b"".join(blobs)
    header = sealed(KIND, {
        "version": VERSION, "lanes": lanes,
        "unit_options": [source.hints.unit_bytes, source.hints.arrow_unit_rows],
        "datasets": entries, "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest()})
    text = json.dumps(header).encode()
    target = Path(out)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    with open(partial, "wb") as f:
        f.write(MAGIC + len(text).to_bytes(8, "little") + text + body)
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
        """Give ``dataset`` its listing and units from this plan, once they are checked
        against it; a ConfigError names what differs from the recipe, an ArtifactError what
        the plan holds that it cannot."""
        entry = self.datasets.get(dataset.name)
        if entry is None:
            raise ConfigError(f"plan {self.path}: has no dataset {dataset.name!r} (it holds "
                              f"{sorted(self.datasets)}); make it again with zephon plan")
        for key, value in _identity(dataset).items():
            if entry[key] != value:
                raise ConfigError(f"plan {self.path}: dataset {dataset.name!r} has {key} = "
                                  f"{entry[key]!r} there and {value!r} here; make the plan "
                                  "again with zephon plan")
        where = f"plan {self.path}: dataset {dataset.name!r}"
        try:
            files = tuple(_file(f, item("files", i)) for i, f in enumerate(entry["files"]))
            for index, data_file in enumerate(files):
                if not dataset.holds(data_file.path):
                    raise StateFieldError(join(item("files", index), "path"),
                                          f"is {data_file.path!r}, which is not under the "
                                          f"dataset's path {dataset.path!r}")
            check_units(entry["table"], files, dataset.documents)
        except StateFieldError as exc:
            raise ArtifactError(f"{where}: {exc}") from None
        dataset.adopt_listing(files, tuple(entry["skipped"]))
        dataset.adopt_units((*self.unit_options, entry["min_units"]), entry["table"])
        extra = dataset.unplanned_files(files)
        if extra and first_rank():
            log.warning("zephon: %s: %d file(s) under %s are not in the plan and are not read "
                        "(first: %s); make the plan again with zephon plan", where, len(extra),
                        dataset.path, extra[0])

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
    """The plan in ``path``, its header and body checked (see the module docstring); a file
    that is not one, is cut short or was changed is an ArtifactError naming it."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"plan file {str(path)!r} cannot be read ({exc.strerror}); write "
                          "it with zephon plan RECIPE --out FILE") from None
    where = f"plan {path}"
    if data.startswith(OLD_MAGIC):
        raise ArtifactError(f"{where}: made by an older zephon (plan version 1, which "
                            "carries no checksum); make it again with zephon plan")
    if not data.startswith(MAGIC):
        raise ArtifactError(f"{where}: not a zephon plan (write one with zephon plan)")
    start = len(MAGIC) + 8
    length = int.from_bytes(data[len(MAGIC):start], "little")
    if length > min(len(data) - start, MAX_HEADER_BYTES):
        raise ArtifactError(f"{where}: cut short (its header says {length} bytes, the file "
                            f"holds {len(data) - start} after it)")
    try:
        header = json.loads(data[start:start + length])
    except ValueError as exc:
        raise ArtifactError(f"{where}: damaged header ({exc})") from None
    fields = opened(header, KIND, where, _check_header)
    body = memoryview(data)[start + length:]
    if len(body) != fields["body_bytes"]:
        raise ArtifactError(f"{where}: cut short or extended (its body holds {len(body)} "
                            f"bytes, the header says {fields['body_bytes']})")
    if hashlib.sha256(body).hexdigest() != fields["body_sha256"]:
        raise ArtifactError(f"{where}: body_sha256 does not match the unit tables: the plan "
                            "was changed or damaged after it was written")
    datasets = {}
    for index, entry in enumerate(fields["datasets"]):
        offset, size = entry["units"]
        try:
            table = UnitTable.from_bytes(body[offset:offset + size])
        except DataError as exc:
            raise ArtifactError(f"{where}: datasets[{index}].units: {exc}") from None
        if len(table) != entry["unit_count"]:
            raise ArtifactError(f"{where}: datasets[{index}].unit_count is "
                                f"{entry['unit_count']}, but its table holds {len(table)}")
        datasets[entry["name"]] = {**entry, "table": table}
    return SavedPlan(str(path), fields["lanes"], tuple(fields["unit_options"]), datasets)


def _check_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header's fields, each checked (raises StateFieldError naming the field)."""
    need_fields(header, "", ("version", "lanes", "unit_options", "datasets", "body_bytes",
                             "body_sha256"))
    version = header["version"]
    if version != VERSION:
        raise StateFieldError("version", f"is {version!r}; this zephon reads plan version "
                                         f"{VERSION}: make the plan again with zephon plan")
    need_int(header["lanes"], "lanes", low=1, high=1 << 20)
    options = need_list(header["unit_options"], "unit_options", 2)
    for i, value in enumerate(options):
        need_int(value, item("unit_options", i), low=1)
    body = need_int(header["body_bytes"], "body_bytes")
    need_str(header["body_sha256"], "body_sha256")
    names = set()
    end = 0
    for i, entry in enumerate(need_list(header["datasets"], "datasets")):
        with within(item("datasets", i)):
            entry = need_fields(entry, "", _DATASET_FIELDS)
            name = need_str(entry["name"], "name")
            if name in names:
                raise StateFieldError("name", f"is {name!r}, which an earlier dataset has")
            names.add(name)
            need_str(entry["path"], "path")
            need_list(entry["files"], "files")
            for j, path in enumerate(need_list(entry["skipped"], "skipped")):
                need_str(path, item("skipped", j))
            offset, size = need_list(entry["units"], "units", 2)
            need_int(offset, item("units", 0), high=MAX_COUNT)
            need_int(size, item("units", 1))
            if offset != end or offset + size > body:
                raise StateFieldError("units", f"is [{offset}, {size}], but the tables lie "
                                               f"one after the other from byte {end} of a "
                                               f"body of {body}")
            end = offset + size
            need_int(entry["unit_count"], "unit_count")
            need_int(entry["min_units"], "min_units", low=1)
    if end != body:
        raise StateFieldError("body_bytes", f"is {body}, but the tables end at byte {end}")
    return header


def _file(entry: Any, path: str) -> DataFile:
    """A listing entry checked and decoded (see :func:`~zephon.io.dataset.encoded`)."""
    parts = need_list(entry, path)
    if len(parts) not in (6, 7):
        raise StateFieldError(path, f"has {len(parts)} item(s), must have 6 or 7")
    need_str(parts[0], item(path, 0))
    need_int(parts[1], item(path, 1))
    fmt = need_str(parts[2], item(path, 2))
    if fmt not in known_formats():
        raise StateFieldError(item(path, 2), f"is {fmt!r}, not a known format")
    if parts[3] is not None:
        need_str(parts[3], item(path, 3))
    need_str(parts[4], item(path, 4))
    if parts[5] is not None:
        for k, rows in enumerate(need_list(parts[5], item(path, 5))):
            need_int(rows, item(item(path, 5), k))
    if len(parts) == 7:
        need_str(parts[6], item(path, 6))
    return decoded(parts)


def check_units(table: UnitTable, files: tuple[DataFile, ...],
                documents: tuple[int, int] | None = None) -> None:
    """Raise StateFieldError unless every unit of ``table`` lies within a file of ``files``
    and the units of each file (each row group) follow each other without gap or overlap,
    from its start to its end where the listing knows it, and every row group with rows and
    every plain JSON Lines file with bytes has units. A few array passes over the table,
    whatever its size, and one pass over the files."""
    if len(table):
        _check_within(table, files, documents)
    _check_covered(table, files)


def _check_within(table: UnitTable, files: tuple[DataFile, ...],
                  documents: tuple[int, int] | None) -> None:
    """Every unit within a file, the units of a file (a row group) one after the other."""
    file, kind = table.file.astype(np.int64), table.kind.astype(np.int64)
    group, start, stop = table.group, table.start, table.stop
    bad = np.flatnonzero((file < 0) | (file >= len(files)))
    if bad.size:
        raise StateFieldError(f"units[{bad[0]}]", f"names file {file[bad[0]]}, but the dataset "
                                                  f"has files 0 to {len(files) - 1}")
    whole = kind == KINDS.index("file")  # a whole file: (0, 0, -1)
    bad = np.flatnonzero((kind >= len(KINDS)) | (group < 0) | (start < 0)
                         | (~whole & (stop <= start)) | (whole & ((start != 0) | (stop != -1))))
    if bad.size:
        u = bad[0]
        raise StateFieldError(f"units[{u}]", f"is kind {kind[u]}, group {group[u]}, rows or "
                                             f"bytes {start[u]}..{stop[u]}: not a unit")
    order = np.lexsort((start, group, kind, file))
    same = ((file[order][1:] == file[order][:-1]) & (kind[order][1:] == kind[order][:-1])
            & (group[order][1:] == group[order][:-1]))
    follows = (stop[order][:-1] == start[order][1:]) & ~whole[order][1:]
    broken = np.flatnonzero(same & ~follows)
    if broken.size:
        u = order[broken[0] + 1]
        raise StateFieldError(f"units[{u}]", f"starts at {start[u]}, but the unit before it "
                                             f"in file {file[u]} ends at "
                                             f"{stop[order[broken[0]]]}: units overlap or "
                                             "leave a gap")
    kinds_of_file = {}
    firsts = np.flatnonzero(np.concatenate([[True], ~same]))
    lasts = np.concatenate([firsts[1:] - 1, [len(order) - 1]])
    for first, last in zip(firsts.tolist(), lasts.tolist(), strict=True):
        u, v = int(order[first]), int(order[last])
        data_file, unit_kind = files[int(file[u])], KINDS[int(kind[u])]
        key = int(file[u])
        if kinds_of_file.setdefault(key, unit_kind) != unit_kind or (
                unit_kind == "file" and last != first):
            raise StateFieldError(f"units[{u}]", f"is a {unit_kind} unit of file {key}, which "
                                                 "other units already cover")
        expected_start, expected_stop = 0, None
        if unit_kind == "row_group":
            groups = data_file.row_groups
            if groups is not None:
                if int(group[u]) >= len(groups):
                    raise StateFieldError(f"units[{u}]", f"names row group {group[u]} of file "
                                                         f"{key}, which has {len(groups)}")
                expected_stop = groups[int(group[u])]
        elif unit_kind == "bytes":
            expected_stop = data_file.size
        elif unit_kind == "rows" and documents is not None:
            expected_start, expected_stop = documents
        if int(start[u]) != expected_start or (unit_kind != "file" and expected_stop
                                                is not None and int(stop[v]) != expected_stop):
            raise StateFieldError(f"units[{u}]", f"file {key}'s {unit_kind} units cover "
                                                 f"{start[u]}..{stop[v]}, not "
                                                 f"{expected_start}..{expected_stop or 'its end'}")


def _check_covered(table: UnitTable, files: tuple[DataFile, ...]) -> None:
    """Every Parquet row group with rows and every JSON Lines file with bytes has a unit."""
    grouped = KINDS.index("row_group")
    present = set(zip(table.file[table.kind == grouped].tolist(),
                      table.group[table.kind == grouped].tolist(), strict=True))
    has_units = set(table.file.tolist())
    for index, data_file in enumerate(files):
        if data_file.fmt == "parquet" and data_file.row_groups is not None:
            for group, rows in enumerate(data_file.row_groups):
                if rows > 0 and (index, group) not in present:
                    raise StateFieldError(item("files", index), f"has row group {group} of "
                                                                f"{rows} row(s), which no unit "
                                                                "reads")
        elif data_file.fmt == "jsonl" and data_file.size > 0 and index not in has_units:
            raise StateFieldError(item("files", index), f"holds {data_file.size} bytes, which "
                                                        "no unit reads")


def plan_changes(plan: SavedPlan, dataset: Dataset, listed: tuple[DataFile, ...]) -> list[str]:
    """What changed under ``dataset``'s path since ``plan`` was made, against a fresh listing
    ``listed``: files added, missing or changed (size or version), each named."""
    entry = plan.datasets.get(dataset.name)
    if entry is None:
        return []
    planned = {f.path: f for f in (decoded(e) for e in entry["files"])}
    now = {f.path: f for f in listed}
    out = []
    for path in sorted(set(now) - set(planned)):
        out.append(f"{dataset.display_name(now[path])}: added since the plan was made (not read)")
    for path in sorted(set(planned) - set(now)):
        out.append(f"{dataset.display_name(planned[path])}: in the plan but missing now")
    for path in sorted(set(planned) & set(now)):
        old, new = planned[path], now[path]
        if (old.size, old.version) != (new.size, new.version):
            out.append(f"{dataset.display_name(new)}: changed since the plan was made (size "
                       f"{old.size} -> {new.size})")
    return out


def plan_digest(plan: SavedPlan) -> str:
    """A digest of the plan's datasets and units (what ``zephon check`` shows)."""
    return digest({name: [e["fingerprint"], e["table"].digest()]
                   for name, e in sorted(plan.datasets.items())})[:16]
