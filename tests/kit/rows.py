"""A row source node for operator tests: rows of given lengths without files or a tokenizer."""

from __future__ import annotations

import numpy as np

from zephon.ops.base import Node
from zephon.records import DocSpan, Record


class Rows(Node):
    """``n`` rows of 4 tokens, each holding one whole document."""

    def __init__(self, n: int):
        self.n, self.i = n, 0

    def next(self):
        if self.i >= self.n:
            return None
        self.i += 1
        span = DocSpan(f"d{self.i}", "x", 0, 0, 4)
        return Record({"input_ids": np.full(4, self.i, np.int32)},
                      {"id": f"r{self.i}", "documents": (span,)})

    def snapshot(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]
