"""Reading data: datasets, formats, and the storage options for remote shards.

The remote dataset classes are registered here by name, so that they load when a path first
uses their scheme (:data:`zephon.io.dataset.REMOTE_CLASSES`).
"""

from zephon.io.dataset import OBJECT_STORES, REMOTE_CLASSES, DataFile, Dataset
from zephon.io.store_options import CacheOptions, StoreOptions

REMOTE_CLASSES.register("hf", "zephon.io.hub.hub_dataset:HubDataset")
REMOTE_CLASSES.register(OBJECT_STORES,
                        "zephon.io.storage.object_store_dataset:ObjectStoreDataset")

__all__ = ["CacheOptions", "DataFile", "Dataset", "StoreOptions"]
