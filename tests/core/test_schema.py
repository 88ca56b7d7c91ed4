"""The recipe schema is derived from the classes that own the options."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from zephon.errors import ConfigError
from zephon.recipe import recipe_schema
from zephon.recipe.schema import dataclass_keys, matches, read_table


def test_every_recipe_key_is_documented():
    undocumented = [f"[{section}] {name}" for section, keys in recipe_schema().items()
                    for name, key in keys.items() if not key.doc]
    assert undocumented == []


def test_a_new_spec_field_is_a_new_key():
    @dataclass(frozen=True)
    class Options:
        size: int = 3
        """How many."""
        names: tuple[str, ...] = ()
        """Which."""
        secret: object = field(default=None, metadata={"recipe": False})
        """Python only."""

    keys = dataclass_keys(Options)
    assert list(keys) == ["size", "names"]
    assert keys["size"].doc == "How many." and keys["size"].default == 3
    assert read_table({"size": 4}, keys, "r.toml", "opts") == {"size": 4}
    with pytest.raises(ConfigError, match=r"r\.toml: size = 'x' in \[opts\] must be an integer"):
        read_table({"size": "x"}, keys, "r.toml", "opts")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['sise'\] in \[opts\]; known: "
                                          r"\['names', 'size'\]"):
        read_table({"sise": 4}, keys, "r.toml", "opts")


@pytest.mark.parametrize("value, hint, ok", [
    (True, bool, True), (1, bool, False), (True, int, False), (3, float, True),
    (["a"], tuple[str, ...], True), ([1], tuple[str, ...], False), (None, int | None, True),
    ({"a": "b"}, dict[str, str], True), ({"a": 1}, dict[str, str], False),
    (["web"], bool | list[str], True), ("web", bool | list[str], False),
])
def test_value_types(value, hint, ok):
    assert matches(value, hint) is ok


def test_sections_follow_their_classes():
    from zephon.ops.tokenize_chat import ROLES

    schema = recipe_schema()
    assert schema["tokenize.chat"]["roles"].default == ROLES
    assert {"primer", "repeat", "on_exhausted", "by"} <= set(schema["mixture"])
    assert "tokenizer_id" not in schema["tokenize"] and "tokenizer" in schema["tokenize"]
    assert {"dp_rank", "dp_world_size", "process_group"}.isdisjoint(schema[""])


def test_keys_print_as_text_a_reader_understands():
    from zephon.recipe import recipe_schema
    from zephon.recipe.schema import format_schema

    batch = recipe_schema()["batch"]
    assert repr(batch) == ("{'microbatch_size': <key microbatch_size: an integer, required>, "
                           "'drop_last': <key drop_last: true or false, default True>}")
    text = format_schema(recipe_schema())
    assert "MISSING" not in text and "Key(" not in text
    assert '[tokenize] with kind = "chat"' in text
    assert "  datasets (a list of strings; default unset): Apply to these datasets only" in text
    assert "  max_length (an integer; required): Tokens per row." in text
