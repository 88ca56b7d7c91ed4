"""Reading data: datasets, formats, and the storage options for remote shards."""

from zephon.io.dataset import DataFile, Dataset
from zephon.io.store_options import CacheOptions, StoreOptions

__all__ = ["CacheOptions", "DataFile", "Dataset", "StoreOptions"]
