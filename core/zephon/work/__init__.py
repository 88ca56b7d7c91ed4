"""Work sources: which data each lane reads, and in what mixture. The engine reads any object
that meets :class:`WorkSource` (see :mod:`zephon.work.protocol`)."""

from zephon.work.estimation import DatasetEstimate, TokenEstimation
from zephon.work.mixture import MixtureSpec
from zephon.work.protocol import DatasetWork, LaneUnit, UnitRows, WorkSource
from zephon.work.schedule import MixtureSchedule, Stage
from zephon.work.static_mixture import ScheduledMixtureWorkSource, StaticMixtureWorkSource

__all__ = ["DatasetEstimate", "DatasetWork", "LaneUnit", "MixtureSchedule", "MixtureSpec",
           "ScheduledMixtureWorkSource", "Stage", "StaticMixtureWorkSource", "TokenEstimation",
           "UnitRows", "WorkSource"]
