"""Exact mixing by deficit.

Each time a document is needed, the mixer picks the dataset whose delivered amount is furthest
below its target share of everything delivered so far: ``argmax_c(w_c * total - delivered_c)``,
ties to the lowest index. Amounts are tokens after tokenization (token mixing) or documents.
Every dataset therefore stays within one document of its target at every point, whatever the
document lengths; no estimate is involved. When a dataset is exhausted and the lane drains, the
remaining weights are renormalized. Plain Python on purpose: with a handful of datasets a
choice costs about a microsecond, numpy's call overhead would be fifty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DeficitMixer:
    def __init__(self, weights: Sequence[float]):
        self.weights = [float(w) for w in weights]
        self.delivered = [0] * len(self.weights)
        self.active = [True] * len(self.weights)
        self._normalized = self._normalize()

    def _normalize(self) -> list[float]:
        total = sum(w for w, a in zip(self.weights, self.active, strict=True) if a)
        return [w / total if a and total > 0 else 0.0
                for w, a in zip(self.weights, self.active, strict=True)]

    def snapshot(self) -> dict[str, Any]:
        return {"delivered": list(self.delivered), "active": list(self.active)}

    def restore(self, state: dict[str, Any]) -> None:
        self.delivered = [int(x) for x in state["delivered"]]
        self.active = [bool(x) for x in state["active"]]
        self._normalized = self._normalize()

    def choose(self) -> int | None:
        total = float(sum(self.delivered))
        best, best_deficit = None, 0.0
        for index, (weight, delivered, active) in enumerate(
                zip(self._normalized, self.delivered, self.active, strict=True)):
            if not active:
                continue
            deficit = weight * total - delivered
            if best is None or deficit > best_deficit:
                best, best_deficit = index, deficit
        return best

    def record(self, index: int, amount: int) -> None:
        self.delivered[index] += amount

    def deactivate(self, index: int) -> None:
        self.active[index] = False
        self._normalized = self._normalize()
