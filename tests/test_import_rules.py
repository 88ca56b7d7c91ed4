"""The layering rules, checked on the source: the core imports no adapter, IO imports nothing
above it, adapters use only the public API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "zephon"
ADAPTERS = [ROOT / "integrations" / "torchtitan" / "zephon_torchtitan",
            ROOT / "integrations" / "megatron" / "zephon_megatron"]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def violations(files, forbidden) -> list[str]:
    out = []
    for path in files:
        for module in sorted(imported_modules(path)):
            if forbidden(module):
                out.append(f"{path.relative_to(ROOT)} imports {module}")
    return out


def test_core_imports_no_adapter():
    assert violations(CORE.rglob("*.py"), lambda m: m.split(".")[0] in (
        "zephon_torchtitan", "zephon_megatron", "torchtitan", "megatron")) == []


def test_io_imports_nothing_above_it():
    def above(module: str) -> bool:
        return module == "zephon" or module.startswith((
            "zephon.work", "zephon.engine", "zephon.pipeline", "zephon.runtime", "zephon.ops",
            "zephon.recipe")) or module in ("zephon.__version__",)

    assert violations((CORE / "io").rglob("*.py"), above) == []


def test_adapters_use_only_the_public_api():
    assert violations([p for d in ADAPTERS for p in d.rglob("*.py")],
                      lambda m: m.startswith(("zephon.engine", "zephon.runtime"))) == []


@pytest.mark.parametrize("source, expected", [
    ("from zephon import __version__\n", {"zephon", "zephon.__version__"}),
    ("def f():\n    from zephon.engine.lane import Lane\n",
     {"zephon.engine.lane", "zephon.engine.lane.Lane"}),
    ("import zephon_megatron.batch as b\n", {"zephon_megatron.batch"}),
])
def test_the_checker_sees_nested_imports(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert imported_modules(path) == expected
