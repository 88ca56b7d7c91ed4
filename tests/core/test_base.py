"""The operator contract: declared order rules, the registry, spec field helpers."""

from __future__ import annotations

import pytest

from tests.core.toy_ops import DropShortSpec, ShoutSpec
from zephon.errors import ConfigError
from zephon.ops import BatchSpec, MapSpec, PackSpec, ShuffleSpec, TokenizeSpec
from zephon.ops.base import BuildContext, check_chain, check_order
from zephon.ops.registry import operator_spec_class

TOKENIZE = TokenizeSpec(tokenizer_id="unused")


def chain(*specs):
    for i, spec in enumerate(specs):
        check_order(specs[:i], spec)


def test_a_valid_chain():
    chain(ShoutSpec(), MapSpec(str), TOKENIZE, DropShortSpec(), MapSpec(str), PackSpec(9),
          ShuffleSpec(4), BatchSpec(2))
    check_chain([TOKENIZE, BatchSpec(2)])


@pytest.mark.parametrize("specs, message", [
    ((TOKENIZE, PackSpec(9), MapSpec(str)), "map must come before pack_flat"),
    ((TOKENIZE, ShuffleSpec(4), PackSpec(9)), "pack_flat must come before shuffle"),
    ((TOKENIZE, BatchSpec(2), ShuffleSpec(4)), "shuffle cannot come after batch"),
    ((TOKENIZE, TokenizeSpec(tokenizer_id="x")), "tokenize already tokenizes these datasets"),
    ((TokenizeSpec(tokenizer_id="x", datasets=("a",)), TokenizeSpec(tokenizer_id="y",
                                                                     datasets=("b", "a"))),
     "already tokenizes these datasets"),
    ((TOKENIZE, PackSpec(9), PackSpec(9, flat=False)), "pack_flat already packs"),
    ((PackSpec(9),), "pack_flat works on token ids"),
    ((DropShortSpec(), TOKENIZE), "drop_short works on token ids"),
])
def test_order_rules_are_errors_naming_both_operators(specs, message):
    with pytest.raises(ConfigError, match=message):
        chain(*specs)


def test_map_and_filter_may_repeat_but_batch_is_required_last():
    chain(MapSpec(str), MapSpec(str), TOKENIZE)
    with pytest.raises(ConfigError, match="needs a batch"):
        check_chain([TOKENIZE, PackSpec(9)])


def test_registry_finds_operators_by_name_and_path():
    assert operator_spec_class("map") is MapSpec
    assert operator_spec_class("drop_short") is DropShortSpec
    assert operator_spec_class("tests.core.toy_ops:ShoutSpec") is ShoutSpec
    with pytest.raises(ConfigError, match="is not an operator spec"):
        operator_spec_class("tests.core.toy_ops:shout_text")
    with pytest.raises(ConfigError, match=r"unknown operator 'mapp'; known: \[.*'map'"):
        operator_spec_class("mapp")


def test_a_name_cannot_be_taken_twice():
    from dataclasses import dataclass
    from typing import ClassVar

    from zephon.ops.base import OperatorSpec

    with pytest.raises(ConfigError, match=r"operator name 'map' .* is taken by"):
        @dataclass(frozen=True)
        class Another(OperatorSpec):
            op_name: ClassVar[str] = "map"


def test_default_fingerprint_is_the_spec_fields():
    op = ShuffleSpec(7, seed=3).build(BuildContext(seed=0, lanes=1))
    assert op.fingerprint() == {"op": "shuffle", "buffer_size": 7, "seed": 3}
    map_op = MapSpec(str.upper).build(None)
    assert map_op.fingerprint() == {"op": "map", "datasets": None, "columns": None,
                                    "fn": "builtins:str.upper"}
