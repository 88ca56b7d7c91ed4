"""Mixture specifications: target proportions of each dataset."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from zephon.errors import ConfigError


@dataclass(frozen=True, init=False)
class MixtureSpec:
    """Target share of each dataset, by name. Weights are normalized to sum to 1.

    With ``token_estimation`` on the work source the shares are shares of tokens (measured after
    tokenization), otherwise shares of documents.
    """

    weights: tuple[tuple[str, float], ...]

    def __init__(self, weights: Mapping[str, float]):
        if not isinstance(weights, Mapping) or not weights:
            raise ConfigError("MixtureSpec needs a non-empty mapping of dataset name -> weight")
        clean = []
        for name, weight in weights.items():
            if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
                raise ConfigError(f"MixtureSpec: weight of {name!r} must be a finite number "
                                  f">= 0, got {weight!r}")
            clean.append((str(name), float(weight)))
        total = sum(w for _, w in clean)
        if total <= 0:
            raise ConfigError("MixtureSpec: weights must not all be zero")
        object.__setattr__(self, "weights", tuple((n, w / total) for n, w in clean))

    def as_dict(self) -> dict[str, float]:
        return dict(self.weights)
