"""The layering rules, checked on the source: the core imports no adapter, IO imports nothing
above it, adapters use only the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "zephon"
ADAPTERS = [ROOT / "integrations" / "torchtitan" / "zephon_torchtitan",
            ROOT / "integrations" / "megatron" / "zephon_megatron",
            ROOT / "integrations" / "torch" / "zephon_torch",
            ROOT / "integrations" / "lightning" / "zephon_lightning"]


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


def test_the_engine_knows_work_sources_only_by_their_protocol():
    """The engine and the loader runtime read through :mod:`zephon.work.protocol`: no
    concrete work source, no file reading (a work source written in a test drives them)."""
    allowed = ("zephon.work.protocol", "zephon.work.schedule")

    def concrete(module: str) -> bool:
        if module == "zephon.work" or module.startswith("zephon.work."):
            return not module.startswith(allowed)
        return module.startswith(("zephon.io.formats", "zephon.io.dataset", "zephon.io.hub",
                                  "zephon.io.storage"))

    engine = list((CORE / "engine").rglob("*.py"))
    assert violations(engine, concrete) == []
    # The runtime may estimate tokens (sampling a source's datasets where it has them).
    assert violations([CORE / "runtime.py", CORE / "pipeline.py"],
                      lambda m: concrete(m) and not m.startswith("zephon.work.estimation")) == []


def test_adapters_use_only_the_public_api():
    assert violations([p for d in [*ADAPTERS, *TOOLS] for p in d.rglob("*.py")],
                      lambda m: m.startswith(("zephon.engine", "zephon.runtime"))) == []


def test_a_training_run_imports_no_tool():
    """The adapters import their tools (CPU shims, demos, smoke runs, tracing, GPU checks)
    nowhere but where a launch asks for CPU training: TorchTitan's launcher and config
    registry, inside the function that applies the CPU settings."""
    importing = sorted(str(path.relative_to(ROOT)) for directory in ADAPTERS
                       for path in directory.rglob("*.py")
                       if any(m.split(".")[0] in ("zephon_torchtitan_tools",
                                                  "zephon_megatron_tools")
                              for m in imported_modules(path)))
    assert importing == ["integrations/torchtitan/zephon_torchtitan/config_registry.py",
                         "integrations/torchtitan/zephon_torchtitan/train.py"]


@pytest.mark.parametrize("source, expected", [
    ("from zephon import __version__\n", {"zephon", "zephon.__version__"}),
    ("def f():\n    from zephon.engine.lane import Lane\n",
     {"zephon.engine.lane", "zephon.engine.lane.Lane"}),
    ("import zephon_megatron.get_batch as b\n", {"zephon_megatron.get_batch"}),
])
def test_the_checker_sees_nested_imports(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert imported_modules(path) == expected


TOOLS = [ROOT / "integrations" / "torchtitan" / "zephon_torchtitan_tools",
         ROOT / "integrations" / "megatron" / "zephon_megatron_tools"]
"""What stands around the adapters (CPU shims, demos, smoke runs, tracing, GPU checks): no
training run imports them."""
PACKAGES = {"zephon": CORE, "zephon_torchtitan": ADAPTERS[0], "zephon_megatron": ADAPTERS[1],
            "zephon_torch": ADAPTERS[2], "zephon_lightning": ADAPTERS[3],
            "zephon_torchtitan_tools": TOOLS[0], "zephon_megatron_tools": TOOLS[1]}


def module_files() -> dict[str, Path]:
    """Every module of the packages by dotted name."""
    modules = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def dependencies(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports, at any depth except under ``TYPE_CHECKING``.
    ``from package import submodule`` depends on the submodule only: importing a submodule runs
    its package's ``__init__``, which is not a dependency the importer chose."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found | (imported_by_string(tree, modules) - {module})


_BY_STRING = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")


def imported_by_string(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """Project modules a file names to import later: ``"package.module:attribute"`` strings
    (registries, lazy factories) and ``importlib.import_module("package.module")`` calls. An
    import by string is an import all the same: a circle through one is a circle."""
    found = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _BY_STRING.match(node.value)
            name = match.group(1) if match else None
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") \
                and node.args and isinstance(node.args[0], ast.Constant):
            name = node.args[0].value
        if isinstance(name, str) and name in modules:
            found.add(name)
    return found


def import_circles() -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (strongly
    connected components of more than one module)."""
    modules = module_files()
    graph = {m: dependencies(m, p, modules) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_itself_through_others():
    assert import_circles() == []


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    package = tmp_path / "zephon"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from zephon.b import g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nfrom zephon import c\n"
                                  "if TYPE_CHECKING:\n    from zephon.a import f\n")
    (package / "c.py").write_text("import zephon.a\n")
    monkeypatch.setitem(PACKAGES, "zephon", package)
    monkeypatch.setitem(PACKAGES, "zephon_torchtitan", tmp_path / "none")
    monkeypatch.setitem(PACKAGES, "zephon_megatron", tmp_path / "none")
    monkeypatch.setitem(PACKAGES, "zephon_torch", tmp_path / "none")
    monkeypatch.setitem(PACKAGES, "zephon_lightning", tmp_path / "none")
    monkeypatch.setitem(PACKAGES, "zephon_torchtitan_tools", tmp_path / "none")
    monkeypatch.setitem(PACKAGES, "zephon_megatron_tools", tmp_path / "none")
    assert import_circles() == [["zephon.a", "zephon.b", "zephon.c"]]
    (package / "c.py").write_text("")
    assert import_circles() == []


def test_adapters_import_only_the_public_modules():
    """Every zephon module an adapter imports is in ``zephon.PUBLIC_MODULES``, and every
    listed module exists."""
    from zephon import PUBLIC_MODULES

    modules = module_files()
    assert [m for m in PUBLIC_MODULES if m not in modules] == []
    found = {f"{path.relative_to(ROOT)} imports {module}"
             for directory in ADAPTERS for path in directory.rglob("*.py")
             for module in imported_modules(path)
             if module.split(".")[0] == "zephon" and module in modules
             and module not in PUBLIC_MODULES}
    assert sorted(found) == []


# Pickle moves a batch's operators and results between a process and the worker processes it
# spawned (zephon.engine.workers): the same program on both ends. Nothing else unpickles.
UNPICKLING_ALLOWED = {CORE / "engine" / "workers.py"}


def unpickling_calls(path: Path) -> list[str]:
    """Calls in ``path`` that can run code stored in bytes: ``pickle.load(s)``,
    ``pickle.Unpickler``, ``dill``/``cloudpickle`` loads, and ``torch.load`` without
    ``weights_only=True``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        if owner in ("pickle", "dill", "cloudpickle") and name in ("load", "loads",
                                                                     "Unpickler"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{name}")
        elif owner == "torch" and name == "load" and not any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                and k.value.value is True for k in node.keywords):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: torch.load without "
                         "weights_only=True")
    return found


def test_nothing_read_back_is_unpickled():
    files = [p for p in [*CORE.rglob("*.py"),
                         *(p for d in [*ADAPTERS, *TOOLS] for p in d.rglob("*.py"))]
             if p not in UNPICKLING_ALLOWED]
    assert [call for path in files for call in unpickling_calls(path)] == []
    assert unpickling_calls(CORE / "engine" / "workers.py"), "the rule test finds nothing"


def test_an_import_by_string_that_leads_back_is_a_circle(tmp_path, monkeypatch):
    package = tmp_path / "zephon"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "registry.py").write_text('PLUGINS = {"toy": "zephon.toy:Toy"}\n')
    (package / "toy.py").write_text("from zephon.registry import PLUGINS\n")
    (package / "lazy.py").write_text("import importlib\n"
                                     "def load():\n    importlib.import_module('zephon.back')\n")
    (package / "back.py").write_text("import zephon.lazy\n")
    monkeypatch.setitem(PACKAGES, "zephon", package)
    for name in ("zephon_torchtitan", "zephon_megatron", "zephon_torch", "zephon_lightning"):
        monkeypatch.setitem(PACKAGES, name, tmp_path / "none")
    assert import_circles() == [["zephon.back", "zephon.lazy"],
                                ["zephon.registry", "zephon.toy"]]


TEST_MODULE = re.compile(r"tests\.\w+\.test_\w+")


def test_tests_import_the_kit_never_one_another():
    """What tests share lives in ``tests/kit``; a test module imports no other test module
    (in code or in the text of a child's code), so moving or deleting one breaks no other."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        text = path.read_text()
        named = {m for m in imported_modules(path) if TEST_MODULE.fullmatch(m)}
        named |= set(re.findall(r"(?:from|import) (tests\.\w+\.test_\w+)", text))
        found += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(named - {own})]
    assert found == []
