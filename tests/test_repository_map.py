"""The README's repository map names every package of the core, the adapters and the test kit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mapped_folders() -> set[str]:
    """The folders the map's block lists, as paths from the repository root (a folder's
    indentation, two spaces a level, puts it under the folder listed above it)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Repository map", 1)[1].split("```", 2)[1]
    folders, stack = set(), []
    for line in block.splitlines():
        found = re.match(r"( *)(\S+/)(?:\s|$)", line)
        if not found:
            continue
        depth = len(found.group(1)) // 2
        stack[depth:] = [found.group(2)]
        folders.add("".join(stack).rstrip("/"))
    return folders


def packages() -> set[str]:
    roots = [ROOT / "core" / "zephon", *(ROOT / "integrations").glob("*/zephon_*"),
             ROOT / "tests" / "kit"]
    return {str(init.parent.relative_to(ROOT)) for root in roots
            for init in root.rglob("__init__.py")}


def test_every_package_is_on_the_map():
    assert sorted(packages() - mapped_folders()) == []


def test_the_map_reader_sees_nesting():
    folders = mapped_folders()
    assert "core/zephon/io/storage" in folders and "core/zephon/io" in folders
