"""User functions for map and filter: named by import path or given as callables."""

from __future__ import annotations

import numpy as np
import pytest

from tests.core.toy_ops import shout_text
from zephon.errors import ConfigError, DataError
from zephon.ops.functions import doc_from_view, doc_view, resolve_function
from zephon.records import Doc


@pytest.mark.parametrize("ref", ["tests.core.toy_ops:shout_text", "tests.core.toy_ops.shout_text",
                                 shout_text])
def test_the_same_function_has_one_name(ref):
    fn, name = resolve_function(ref, "map")
    assert fn is shout_text and name == "tests.core.toy_ops:shout_text"


@pytest.mark.parametrize("ref, message", [
    ("", "fn must be"), ("nomodule", "filter: fn: 'nomodule' is not 'package.module:name'"),
    ("tests.core.toy_ops:ShoutSpec.nothing", "has no"), ("tests.core.toy_ops:__doc__",
                                                        "is not callable"),
])
def test_bad_references(ref, message):
    with pytest.raises(ConfigError, match=message):
        resolve_function(ref, "filter")


def test_views_before_and_after_tokenization():
    raw = Doc(None, "d:0:1", "d", fields={"text": "a", "n": 1})
    assert doc_view(raw) == {"text": "a", "n": 1}
    tokens = Doc(np.arange(4, dtype=np.int32), "d:0:1", "d", 5, np.ones(4, bool))
    view = doc_view(tokens)
    assert set(view) == {"input_ids", "train_mask"}
    back = doc_from_view(tokens, {"input_ids": [7, 8]}, "f", "here")
    assert back.tokens.dtype == np.int32 and back.doc_start == 5 and back.train_mask is None
    with pytest.raises(DataError, match="train_mask of shape"):
        doc_from_view(tokens, {"input_ids": [7, 8], "train_mask": [True]}, "f", "here")
    with pytest.raises(DataError, match="1-D integer array"):
        doc_from_view(tokens, {"input_ids": [[1, 2]]}, "f", "here")
