"""Exact mixing by deficit.

Each time a document is needed, the mixer picks the dataset whose delivered amount is furthest
below its target share of everything delivered so far: ``argmax_c(w_c * total - delivered_c)``,
ties to the lowest index. Amounts are tokens after tokenization (token mixing) or documents.
Every dataset therefore stays within one document of its target at every point, whatever the
document lengths; no estimate is involved. When a dataset is exhausted and the lane drains, the
remaining weights are renormalized.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class DeficitMixer:
    def __init__(self, weights: np.ndarray):
        self.weights = np.asarray(weights, dtype=np.float64)
        self.delivered = np.zeros(len(weights), dtype=np.int64)
        self.active = np.ones(len(weights), dtype=bool)

    def snapshot(self) -> dict[str, Any]:
        return {"delivered": self.delivered.tolist(), "active": self.active.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.delivered = np.array(state["delivered"], dtype=np.int64)
        self.active = np.array(state["active"], dtype=bool)

    def choose(self) -> int | None:
        if not self.active.any():
            return None
        weights = np.where(self.active, self.weights, 0.0)
        weights /= weights.sum()
        deficit = weights * float(self.delivered.sum()) - self.delivered
        deficit[~self.active] = -np.inf
        return int(np.argmax(deficit))

    def record(self, index: int, amount: int) -> None:
        self.delivered[index] += amount

    def deactivate(self, index: int) -> None:
        self.active[index] = False
