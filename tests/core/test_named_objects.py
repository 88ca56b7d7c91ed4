"""Objects named by strings: one import convention and one error, and a registry that imports
an entry only when it is first asked for."""

from __future__ import annotations

import sys

import pytest

from zephon.errors import ConfigError
from zephon.named_objects import MissingModule, Registry, import_named


def test_a_name_imports_its_object_in_either_spelling() -> None:
    import json

    assert import_named("json:dumps", "fn") is json.dumps
    assert import_named("json.dumps", "fn") is json.dumps
    assert import_named("json:JSONDecoder.decode", "fn") is json.JSONDecoder.decode


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_zq:f", r"fn: cannot import module 'no_such_module_zq' for "),
    ("json:nope", r"fn: module 'json' has no 'nope' \('json:nope'\)"),
    ("nodots", r"fn: 'nodots' is not 'package.module:name'"),
    ("", r"fn must be 'package.module:name'"),
])
def test_a_name_that_does_not_resolve_is_named(ref, message) -> None:
    with pytest.raises(ConfigError, match=message):
        import_named(ref, "fn")


def test_a_module_not_installed_says_which() -> None:
    with pytest.raises(MissingModule) as caught:
        import_named("no_such_module_zq.sub:f", "opener")
    assert caught.value.module == "no_such_module_zq"


def test_a_registry_imports_a_named_entry_when_first_asked(tmp_path, monkeypatch) -> None:
    (tmp_path / "lazy_entry_zq.py").write_text("VALUE = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("thing", {"lazy": "lazy_entry_zq:VALUE"})
    registry.register("eager", 3)
    assert "lazy_entry_zq" not in sys.modules and not registry.is_loaded("lazy")
    assert sorted(registry) == ["eager", "lazy"] and registry.is_loaded("eager")
    value = registry.get("lazy")
    assert value is sys.modules["lazy_entry_zq"].VALUE and registry.get("lazy") is value
    assert registry.is_loaded("lazy")
    with pytest.raises(ConfigError, match=r"unknown thing 'other'; known: \['eager', 'lazy'\]"):
        registry.get("other")
    registry.unregister("eager")
    assert "eager" not in registry
