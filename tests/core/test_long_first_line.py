"""``zephon check`` reads a bounded prefix of a JSON Lines file's first line: the fields that
begin in it are told, a field past it is said not to be told, and the bytes read and held do
not grow with the line (10/20/40 MB lines took 9/13/33 s, and 300 MB did not end)."""

from __future__ import annotations

import logging
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from zephon.io.formats.jsonl import FIELDS_PREFIX_BYTES, fields
from zephon.recipe.checks import check_recipe, peek_field

LINE_BYTES = 20 << 20


def bytes_read() -> int:
    """Bytes this process has read from files so far (``rchar`` of /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def write_long_line(path: Path) -> Path:
    text = "a" * LINE_BYTES
    lines = ('{"id": 7, "tokens": [1, 2, 3], "text": "' + text + '", "lang": "en"}\n'
             '{"id": 8, "text": "b", "lang": "en"}\n').encode()
    if path.suffix == ".zst":
        lines = zstandard.ZstdCompressor().compress(lines)
    path.write_bytes(lines)
    return path


@pytest.mark.parametrize("name, compression", [("long.jsonl", None),
                                               ("long.jsonl.zst", "zstd")])
def test_the_fields_of_a_20_mb_first_line_come_from_a_bounded_prefix(tmp_path, name,
                                                                     compression):
    path = write_long_line(tmp_path / name)
    tracemalloc.start()
    before = bytes_read()
    try:
        kinds = fields(str(path), compression)
        read = bytes_read() - before
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert kinds == {"id": "int", "tokens": "list<int>", "text": "text"}
    assert kinds.complete is False
    assert f"longer than the {FIELDS_PREFIX_BYTES} bytes" in kinds.note
    assert read < FIELDS_PREFIX_BYTES + (1 << 20)
    assert peak < 4 * FIELDS_PREFIX_BYTES  # the prefix, its text and a copy, not the line


def test_check_tells_the_fields_in_the_prefix_and_says_when_it_cannot(tmp_path, tokenizer_dir,
                                                                     caplog):
    (tmp_path / "data").mkdir()
    path = write_long_line(tmp_path / "data" / "long.jsonl")
    assert peek_field(str(path), "jsonl", None, "text") == "text"
    assert peek_field(str(path), "jsonl", None, "lang") == "unknown"

    def recipe(field: str) -> Path:
        out = tmp_path / f"{field}.toml"
        out.write_text(f'lanes = 2\n[[datasets]]\nname = "long"\npath = "data"\n'
                       f'[tokenize]\ntokenizer = "{tokenizer_dir}"\nfield = "{field}"\n')
        return out

    assert check_recipe(recipe("text")) == []
    problems = check_recipe(recipe("id"))
    assert len(problems) == 1 and "field 'id' holds int, but tokenize needs text" in problems[0]
    with caplog.at_level(logging.WARNING):
        assert check_recipe(recipe("lang")) == []
    told = [r.getMessage() for r in caplog.records if "could not tell" in r.getMessage()]
    assert len(told) == 1 and "long.jsonl: could not tell whether it has the field 'lang'" in \
        told[0] and "'id', 'tokens', 'text'" in told[0]
