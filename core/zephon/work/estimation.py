"""Token estimation: how many tokens each dataset holds, before reading it all.

Mixing by tokens is exact without it (the mixer counts real tokens after tokenization); the
estimate sizes the read-ahead of each dataset and tells the user, before training, roughly how
many tokens and passes each dataset will contribute.

``primer="measure"`` tokenizes ``calibration_samples`` documents taken evenly from at most
``calibration_shards_max`` work units of each dataset and extrapolates tokens per byte of
text. ``primer="bytes"`` assumes 4 bytes of UTF-8 text per token and reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon.errors import ConfigError

PRIMERS = ("measure", "bytes")


@dataclass(frozen=True)
class TokenEstimation:
    """Turns on token-proportion mixing and says how dataset sizes are estimated."""

    primer: str = "measure"
    """``measure`` (tokenize a sample) or ``bytes`` (assume 4 bytes per token)."""
    calibration_samples: int = 2048
    """Documents tokenized per dataset by ``measure``."""
    calibration_shards_max: int = 4
    """Work units sampled per dataset by ``measure``."""

    def __post_init__(self) -> None:
        if self.primer not in PRIMERS:
            raise ConfigError(f"TokenEstimation: primer={self.primer!r} is not one of {PRIMERS}")
        if self.calibration_samples <= 0:
            raise ConfigError("TokenEstimation: calibration_samples must be positive")
        if self.calibration_shards_max <= 0:
            raise ConfigError("TokenEstimation: calibration_shards_max must be positive")


@dataclass(frozen=True)
class DatasetEstimate:
    """Estimated size of one dataset."""

    name: str
    documents: int | None
    tokens_per_document: float
    tokens: float | None
