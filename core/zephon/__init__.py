"""Zephon: a data loader for foundation-model training.

Public API::

    from zephon import Pipeline, SampleBatch
    from zephon.io import Dataset, CacheOptions, StoreOptions
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation
"""

from zephon.batch import SampleBatch
from zephon.errors import ConfigError, DataError, StateMismatchError, WorkerError, ZephonError
from zephon.pipeline import Pipeline
from zephon.records import DocSpan, Record
from zephon.report import PipelineReport

__version__ = "0.3.0.dev0"

__all__ = [
    "ConfigError",
    "DataError",
    "DocSpan",
    "Pipeline",
    "PipelineReport",
    "Record",
    "SampleBatch",
    "StateMismatchError",
    "WorkerError",
    "ZephonError",
]
