"""Work sources: which data each lane reads, and in what mixture."""

from zephon.work.estimation import DatasetEstimate, TokenEstimation
from zephon.work.mixture import MixtureSpec
from zephon.work.static_mixture import StaticMixtureWorkSource

__all__ = ["DatasetEstimate", "MixtureSpec", "StaticMixtureWorkSource", "TokenEstimation"]
