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

    Weights must be finite and >= 0, not all 0; a weight of 0 keeps a dataset out of the run
    (listed in reports with a target of 0). Where the sum of the weights overflows, they are
    divided by the largest one first, so the sum lies in [1, n]: ``{"a": 1e308, "b": 1e308}``
    gives shares of 0.5. A positive weight whose share still rounds to 0 (more than about
    1e308 times below the largest) is a ConfigError naming the dataset: it would never be
    read.
    """

    weights: tuple[tuple[str, float], ...]

    def __init__(self, weights: Mapping[str, float]):
        if not isinstance(weights, Mapping) or not weights:
            raise ConfigError("MixtureSpec needs a non-empty mapping of dataset name -> weight")
        bad = [f"weight of {name!r} must be a finite number >= 0, got {weight!r}"
               for name, weight in weights.items()
               if not isinstance(weight, (int, float)) or isinstance(weight, bool)
               or not math.isfinite(weight) or weight < 0]
        if bad:
            raise ConfigError("MixtureSpec: " + "; ".join(bad))
        clean = [(str(name), float(weight)) for name, weight in weights.items()]
        object.__setattr__(self, "weights", normalized(clean))

    def as_dict(self) -> dict[str, float]:
        return dict(self.weights)


def normalized(weights: list[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """``weights`` (finite, >= 0) scaled to sum to 1, without overflow (see MixtureSpec)."""
    largest = max(w for _, w in weights)
    if largest <= 0:
        raise ConfigError("MixtureSpec: weights must not all be zero")
    scaled = weights
    total = sum(w for _, w in scaled)
    if not math.isfinite(total):  # finite weights whose sum overflowed
        scaled = [(n, w / largest) for n, w in weights]
        total = sum(w for _, w in scaled)
    shares = tuple((n, w / total) for n, w in scaled)
    for (name, weight), (_, share) in zip(weights, shares, strict=True):
        if weight > 0 and share <= 0:
            raise ConfigError(
                f"MixtureSpec: weight of {name!r} ({weight!r}) is positive, but its share of "
                f"the total rounds to 0 (the largest weight is {largest!r}), so it would "
                "never be read; use weights of comparable size, or 0 to leave it out")
    return shares
