"""Build tensors yourself when the records are not token sequences."""

import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

# A small local image dataset: 8x8 "images" stored as lists, with integer labels.
root = tempfile.mkdtemp(prefix="zephon-images-")
rng = np.random.default_rng(0)
images = rng.random((256, 8, 8)).astype(np.float32)
pq.write_table(pa.table({"image": [img.tolist() for img in images],
                         "label": rng.integers(0, 10, size=256).tolist()}),
               f"{root}/images.parquet", row_group_size=64)
work_source = StaticMixtureWorkSource(datasets=[Dataset.from_path("images", root)], seed=0)

pipeline = Pipeline(work_source).batch(microbatch_size=32)

for sample_batch in pipeline:
    # to_training only speaks token sequences, so read the payloads directly.
    records = sample_batch.records
    images = torch.stack([torch.as_tensor(r.payload["image"]) for r in records])
    labels = torch.as_tensor([r.payload["label"] for r in records])
    print(tuple(images.shape), tuple(labels.shape))
