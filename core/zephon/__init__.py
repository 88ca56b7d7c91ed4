"""Zephon: a data loader for foundation-model training.

Public API::

    from zephon import Pipeline, SampleBatch
    from zephon.io import Dataset, CacheOptions, StoreOptions
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

:data:`PUBLIC_MODULES` lists every module whose names are public; framework adapters import
only these (a test holds them to it), and :mod:`zephon.integration` is where they start.
"""

from zephon.errors import ConfigError, DataError, StateMismatchError, WorkerError, ZephonError
from zephon.pipeline import Pipeline
from zephon.records import DocSpan, Record
from zephon.report import PipelineReport
from zephon.sample_batch import SampleBatch

__version__ = "0.3.0.dev0"

PUBLIC_MODULES = (
    "zephon",
    "zephon.integration",  # what every framework adapter needs: geometry, lanes, a session
    "zephon.recipe",  # DataRecipe, TrainingPreset
    "zephon.recipe.checks",  # check_recipe
    "zephon.recipe.presets",  # what each adapter fixes in [to_training]
    "zephon.errors",
    "zephon.io",  # Dataset, CacheOptions, StoreOptions
    "zephon.io.indexed",  # Megatron's indexed datasets
    "zephon.work",  # StaticMixtureWorkSource, MixtureSpec, TokenEstimation
    "zephon.ops",  # operator specs, for custom operators
    "zephon.ops.pretokenized",
    "zephon.loader_options",  # LoaderOptions, DEFAULT_LANES_PER_READER
    "zephon.text.tokenizer",  # load_tokenizer, resolve_encoder
    "zephon.distributed",  # the process-wide gloo group, launcher stores
    "zephon.meter",  # LoaderMeter, the zephon/ metrics
    "zephon.trace",  # trace lines: what was in step N
    "zephon.report",  # PipelineReport, DatasetReport: what a run read, per dataset
    "zephon.demo.assets",  # the bundled corpus and tokenizer
)
"""Modules whose public names (those without a leading underscore) are the API."""

__all__ = [
    "PUBLIC_MODULES",
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
