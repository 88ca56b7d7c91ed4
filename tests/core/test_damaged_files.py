"""Damaged files: every read of a damaged copy is an error of ours naming the file, or the
documents the undamaged file gives, or documents changed only where the damage was. Never a
crash, never a raw exception, never bytes of a column that was not asked for.

The fuzz loop runs in a child process, so a crash (a segfault in a reader) is a failure that
names the case, not a dead test session.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.errors import DataError
from zephon.io.formats import PlanHints, detect_format, plan_file, read_unit

HINTS = PlanHints(unit_bytes=512, arrow_unit_rows=6)
ROWS = 24
REQUESTED = ["text", "ids"]
MARKER = "SECRET-API-KEY-QZXJ-PASSWORD=HUNTER2"
"""Every value of the two unrequested columns contains this; none of its 4-byte pieces can come
from the requested columns (lower-case text, small ids) or from one changed byte."""
MARKER_PIECES = [MARKER[i:i + 4].encode() for i in range(len(MARKER) - 3)]
CASES = 200
SEED = 4343


def _rows() -> dict[str, list]:
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]
    texts = [f"row {i} " + " ".join(rng.choice(words, int(rng.integers(3, 30))))
             for i in range(ROWS)]
    ids = [rng.integers(0, 1000, int(rng.integers(0, 12))).tolist() for _ in range(ROWS)]
    return {"secret_a": [f"{MARKER}-a{i}" for i in range(ROWS)], "text": texts,
            "ids": ids, "secret_b": [f"{MARKER}-b{i}" for i in range(ROWS)]}


def write_originals(root: Path) -> list[Path]:
    """Small Arrow (file and stream), Parquet (plain and default encodings) and JSON Lines
    files with the requested columns between two unrequested ones."""
    rows = _rows()
    table = pa.table({"secret_a": rows["secret_a"], "text": rows["text"],
                      "ids": pa.array(rows["ids"], pa.list_(pa.int32())),
                      "secret_b": rows["secret_b"]})
    paths = [root / "plain.arrow", root / "stream.arrow", root / "plain.parquet",
             root / "packed.parquet", root / "rows.jsonl"]
    with pa.ipc.new_file(str(paths[0]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=8):
            writer.write_batch(batch)
    with pa.ipc.new_stream(str(paths[1]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=8):
            writer.write_batch(batch)
    pq.write_table(table, paths[2], row_group_size=8, compression="NONE",
                   use_dictionary=False, write_statistics=False)
    pq.write_table(table, paths[3], row_group_size=8)
    paths[4].write_text("".join(json.dumps({k: rows[k][i] for k in rows}) + "\n"
                                for i in range(ROWS)))
    return paths


def read_file(path: Path) -> list[tuple[int, str, list[int] | None]]:
    """Every row of ``path`` through the real reader: plan, then read each unit."""
    fmt, compression = detect_format(path.name)
    out = []
    for unit in plan_file(str(path), fmt, compression, HINTS, min_units=2):
        table, keys = read_unit(str(path), fmt, compression, unit, REQUESTED, str(path))
        for r, key in enumerate(keys):
            ids = table["ids"][r]
            out.append((key, table["text"][r],
                        list(ids) if isinstance(ids, (list, np.ndarray)) else ids))
    return out


def _damage(data: bytes, rng: np.random.Generator) -> tuple[bytes, int, int, str]:
    """A damaged copy of ``data``: (copy, first damaged byte, end of damage, description)."""
    kind = rng.choice(["flip", "truncate", "overwrite"])
    out = bytearray(data)
    if kind == "truncate":
        at = int(rng.integers(0, len(data)))
        return bytes(out[:at]), at, len(data), f"truncate at {at}"
    if kind == "flip":
        at = int(rng.integers(0, len(data)))
        out[at] ^= int(rng.integers(1, 256))
        return bytes(out), at, at + 1, f"flip byte {at}"
    at = int(rng.integers(0, len(data)))
    size = int(rng.integers(1, 65))
    fill = rng.choice(["random", "zero", "ones"])
    chunk = (rng.integers(0, 256, size, dtype=np.uint8).tobytes() if fill == "random" else
             (b"\x00" if fill == "zero" else b"\xff") * size)[:len(data) - at]
    out[at:at + len(chunk)] = chunk
    return bytes(out), at, at + len(chunk), f"overwrite {at}..{at + len(chunk)} ({fill})"


def _raw(value) -> bytes:
    """The bytes a read value is made of: text as UTF-8, ids as the int32 they were read as."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes):
        return value
    try:
        return np.asarray(value, np.int64).astype("<i4").tobytes()
    except (TypeError, ValueError, OverflowError):
        return repr(value).encode()


def _leaked(rows) -> bool:
    return any(piece in _raw(text) + _raw(ids) for _, text, ids in rows
               for piece in MARKER_PIECES)


def _spans(data: bytes, values: list[str]) -> list[tuple[int, int] | None]:
    """The byte range of each value where it occurs exactly once in ``data``, else None."""
    out = []
    for value in values:
        raw = json.dumps(value)[1:-1].encode()
        at = data.find(raw)
        out.append((at, at + len(raw)) if at >= 0 and data.find(raw, at + 1) < 0 else None)
    return out


def _check(path: Path, original: list, data: bytes, lo: int, hi: int) -> str:
    """Read the damaged ``path``; the outcome's name, or raise AssertionError saying why not."""
    try:
        rows = read_file(path)
    except DataError as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        return "error"
    assert not _leaked(rows), f"bytes of an unrequested column were read: {rows}"
    if rows == original:
        return "same"
    if path.name in ("plain.parquet", "plain.arrow", "stream.arrow", "rows.jsonl"):
        source = _rows()
        secrets = [s for s in _spans(data, source["secret_a"] + source["secret_b"]) if s]
        inside = [i for i, s in enumerate(_spans(data, source["text"]))
                  if s and s[0] <= lo and hi <= s[1]]
        if any(s[0] <= lo and hi <= s[1] for s in secrets):
            raise AssertionError("damage inside an unrequested column changed what was read")
        if inside:
            changed = [i for i, (a, b) in enumerate(zip(rows, original)) if a != b]
            assert len(rows) == len(original) and changed == inside, \
                f"damage inside row {inside[0]}'s text changed rows {changed}"
    return "changed"


def fuzz(root: Path, seed: int, cases: int) -> dict[str, int]:
    """Damage ``cases`` copies of the original files; count the outcomes. Prints each case
    before reading it, so the parent can name the case a crash happened in."""
    originals = write_originals(root)
    expected = {p: read_file(p) for p in originals}
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for case in range(cases):
        source = originals[case % len(originals)]
        data, lo, hi, what = _damage(source.read_bytes(), rng)
        path = root / f"case{case}-{source.name}"
        path.write_bytes(data)
        print(f"case {case}: {source.name}, {what}", flush=True)
        try:
            outcome = _check(path, expected[source], source.read_bytes(), lo, hi)
        except AssertionError as exc:
            raise AssertionError(f"case {case} (seed {seed}, {source.name}, {what}): "
                                 f"{exc}") from None
        except Exception as exc:
            raise AssertionError(f"case {case} (seed {seed}, {source.name}, {what}): "
                                 f"{type(exc).__name__}: {exc}") from None
        key = f"{source.suffix[1:]}:{outcome}"
        counts[key] = counts.get(key, 0) + 1
        path.unlink()
    return counts


def test_fuzzed_damage_is_an_error_or_harmless(tmp_path):
    """200 damaged copies (byte flips, truncations, overwritten ranges) of Arrow, Parquet and
    JSON Lines files, read in a child process; about 3 s."""
    code = ("import json, sys; from pathlib import Path; "
            "from tests.core.test_damaged_files import fuzz; "
            f"print(json.dumps(fuzz(Path(sys.argv[1]), {SEED}, {CASES})))")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, env=env, cwd=root, timeout=300)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, (f"the fuzz child ended with {done.returncode} after "
                                  f"{lines[-1] if lines else 'no case'}:\n{done.stderr[-3000:]}")
    counts = json.loads(lines[-1])
    assert sum(counts.values()) == CASES
    assert all(counts.get(f"{fmt}:error") for fmt in ("arrow", "parquet", "jsonl")), counts


def _arrow_file(path: Path) -> dict[str, list]:
    """An Arrow IPC file of one record batch of 6 rows, a requested ``text`` column before an
    unrequested ``secret`` one; the file position and size of each column's buffers. Secrets of
    20 characters keep the bytes between the columns valid UTF-8 (offsets below 128)."""
    table = pa.table({"text": [f"row {i} alpha beta" for i in range(6)],
                      "secret": [f"{MARKER[:15]}{i:05d}" for i in range(6)]})
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    source = pa.memory_map(str(path))
    base = source.read_buffer().address
    batch = pa.ipc.open_file(source).get_batch(0)
    return {name: [None if b is None else (b.address - base, b.size)
                   for b in batch.column(name).buffers()] for name in batch.schema.names}


def _read_text(path: Path) -> list:
    unit = plan_file(str(path), "arrow", None, HINTS)[0]
    return read_unit(str(path), "arrow", None, unit, ["text"], str(path))[0]["text"]


def test_arrow_offset_past_its_buffer_is_an_error_not_another_columns_bytes(tmp_path):
    """A damaged last offset made the last text run on into the next column's bytes."""
    path = tmp_path / "run_on.arrow"
    layout = _arrow_file(path)
    (offsets_at, offsets_size), (data_at, _) = layout["text"][1:]
    secret_at = layout["secret"][2][0]
    raw = bytearray(path.read_bytes())
    last = offsets_at + offsets_size - 4
    end = int.from_bytes(raw[last:last + 4], "little")
    raw[last:last + 4] = (secret_at - data_at + 40).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    assert end < secret_at - data_at + 40
    with pytest.raises(DataError, match=rf"{path.name}: row 5: column 'text' is damaged "
                                        r"\(Offset invariant failure"):
        _read_text(path)


def test_arrow_offset_far_outside_the_file_is_an_error_not_a_crash(tmp_path):
    """An offset pointing 2 GB past the map killed the process (SIGSEGV) when read; a child
    process reads it, so a crash fails this test instead of ending the session."""
    path = tmp_path / "far.arrow"
    layout = _arrow_file(path)
    offsets_at = layout["text"][1][0]
    raw = bytearray(path.read_bytes())
    raw[offsets_at + 8:offsets_at + 12] = (2**31 - 16).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    code = ("import sys; from pathlib import Path; "
            "from tests.core.test_damaged_files import _read_text\n"
            "try:\n    _read_text(Path(sys.argv[1]))\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, env=env, cwd=root, timeout=120)
    assert done.returncode == 0, f"the reading process ended with {done.returncode}"
    assert done.stdout.startswith(f"DataError {path}: row 1: column 'text' is damaged")


def test_arrow_buffer_moved_onto_another_column_is_an_error(tmp_path):
    """A damaged buffer position in a batch's metadata pointed the text at the unrequested
    column's bytes: offsets in range and valid UTF-8, so only the overlap shows it."""
    path = tmp_path / "moved.arrow"
    layout = _arrow_file(path)
    body = min(b[0] for buffers in layout.values() for b in buffers if b and b[1])
    data_at, data_size = layout["text"][2]
    secret_at = layout["secret"][2][0]
    raw = path.read_bytes()
    entry = struct.pack("<qq", data_at - body, data_size)
    assert raw.count(entry) == 1
    path.write_bytes(raw.replace(entry, struct.pack("<qq", secret_at - body, data_size)))
    with pytest.raises(DataError, match=rf"{path.name}: rows 0\.\.6: column 'text' shares "
                                        "bytes with column 'secret'"):
        _read_text(path)


def test_arrow_field_named_twice_is_an_error(tmp_path):
    path = tmp_path / "twice.arrow"
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(DataError, match=r"twice\.arrow: field 'text' appears 2 times"):
        _read_text(path)


def _parquet_with_bad_utf8(path: Path, table: pa.Table, placeholder: bytes) -> None:
    pq.write_table(table, path, compression="NONE", use_dictionary=False,
                   write_statistics=False, row_group_size=4)
    raw = path.read_bytes()
    assert raw.count(placeholder) == 1
    path.write_bytes(raw.replace(placeholder, b"\xff\xfe" * (len(placeholder) // 2)))


def test_parquet_invalid_utf8_names_file_and_row(tmp_path):
    """Invalid UTF-8 in a Parquet string column was a raw UnicodeDecodeError naming nothing."""
    path = tmp_path / "text.parquet"
    texts = [f"text {i}" for i in range(10)]
    texts[6] = "bad QQQQ here"
    _parquet_with_bad_utf8(path, pa.table({"text": texts, "n": list(range(10))}), b"QQQQ")
    units = plan_file(str(path), "parquet", None, HINTS)
    read_unit(str(path), "parquet", None, units[0], ["text"], "text.parquet")  # rows 0..4
    with pytest.raises(DataError, match=r"text\.parquet: row 6: column 'text' is damaged "
                                        r"\(.*Invalid UTF8"):
        read_unit(str(path), "parquet", None, units[1], ["text"], "text.parquet")
    read_unit(str(path), "parquet", None, units[1], ["n"], "text.parquet")  # not requested


def test_parquet_invalid_utf8_in_a_nested_column_names_the_rows(tmp_path):
    path = tmp_path / "nested.parquet"
    turns = [[{"role": "user", "content": f"q{i}"}] for i in range(8)]
    turns[5][0]["content"] = "QQQQ"
    _parquet_with_bad_utf8(path, pa.table({"messages": turns}), b"QQQQ")
    unit = plan_file(str(path), "parquet", None, HINTS)[1]
    with pytest.raises(DataError, match=r"nested\.parquet: rows 4\.\.8: column 'messages' is "
                                        "damaged"):
        read_unit(str(path), "parquet", None, unit, ["messages"], "nested.parquet")


@pytest.mark.parametrize("change", ["rewritten", "same_size", "removed"])
def test_a_file_changed_during_a_run_is_named_as_changed(tmp_path, tokenizer_dir, change):
    from tests.conftest import write_parquet
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    path = write_parquet(tmp_path / "data" / "a.parquet",
                         [f"doc {i} " + "word " * 20 for i in range(64)], row_group_size=4)
    source = StaticMixtureWorkSource([Dataset.from_path("web", str(tmp_path / "data"))],
                                     shuffle_units=False)
    pipeline = (Pipeline(source).options(prefetch=0).tokenize(tokenizer_dir)
                .pack_flat(33).batch(1))
    iterator = iter(pipeline)
    next(iterator)
    if change == "rewritten":  # another writer's layout: fewer, larger row groups
        write_parquet(path, [f"new {i}" for i in range(10)], row_group_size=100)
    elif change == "same_size":
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF  # inside the footer's last 4 KiB
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    with pytest.raises(DataError, match=r"a\.parquet: changed during the run \((.*bytes when "
                       r"listed.*|its last 4 KiB differ.*|it was removed)\)"):
        for _ in range(64):
            next(iterator)
