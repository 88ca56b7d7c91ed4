"""Edits to data files that keep their size (lines reordered in place), for the file-identity
checks."""

from __future__ import annotations

import random
from pathlib import Path


def reorder_lines(path: Path, start: int, stop: int, seed: int = 1) -> None:
    """Lines ``start..stop`` of ``path`` shuffled in place: the same size, and every byte
    outside their span as it was."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    moved = lines[start:stop]
    random.Random(seed).shuffle(moved)
    path.write_bytes(b"".join(lines[:start] + moved + lines[stop:]))
    changed = path.read_bytes()
    assert len(changed) == len(data) and changed != data
