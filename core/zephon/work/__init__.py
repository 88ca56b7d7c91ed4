"""Work sources: which data each lane reads, and in what mixture."""

from zephon.work.estimation import DatasetEstimate, TokenEstimation
from zephon.work.mixture import MixtureSpec
from zephon.work.schedule import MixtureSchedule, Stage
from zephon.work.static_mixture import ScheduledMixtureWorkSource, StaticMixtureWorkSource

__all__ = ["DatasetEstimate", "MixtureSchedule", "MixtureSpec", "ScheduledMixtureWorkSource",
           "Stage", "StaticMixtureWorkSource", "TokenEstimation"]
