"""Hub datasets fetch a lane's next units' files ahead, as the object stores do: the same
rows, each shard downloaded once, and the downloads in the background."""

from __future__ import annotations

from tests.hub.hubdata import docs, sharded
from zephon import Pipeline
from zephon.engine.dataset_source import DatasetSource
from zephon.io import Dataset
from zephon.io.hub.dataset import HubDataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def test_a_lane_fetches_its_next_shards_ahead_and_reads_the_same(hub, io_options, tmp_path):
    shards = sharded(docs(120, seed=8), 6, "data/train-{i:05d}-of-{n:05d}.parquet",
                     row_group_size=20)
    hub.create("ahead/corpus", shards)
    asked: list[list[str]] = []
    original = HubDataset.fetch_ahead

    def recording(self, data_files):
        asked.append([f.path for f in data_files])
        original(self, data_files)

    def read(path, options):
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)],
                                         MixtureSpec({"d": 1.0}), seed=2, repeat=False)
        pipeline = Pipeline(source).batch(4, drop_last=False).options(lanes=1, **options)
        return [r.payload["text"] for b in pipeline for r in b.records], pipeline

    HubDataset.fetch_ahead = recording
    try:
        remote, pipeline = read("hf://ahead/corpus/train", {"io_options": io_options})
    finally:
        HubDataset.fetch_ahead = original
    for name, data in shards.items():
        (tmp_path / "local" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / name).write_bytes(data)
    assert remote == read(str(tmp_path / "local" / "data"), {})[0]
    assert asked and all(0 < len(paths) <= DatasetSource.FETCH_AHEAD for paths in asked)
    assert len({p for paths in asked for p in paths}) >= len(shards) - 1
    dataset = pipeline.loader().source.datasets[0]
    dataset.wait_fetches()
    assert dataset.cache.stats.downloads == len(shards)  # each shard once, either way
    assert dataset.fetches.fetched >= len(shards) - 1
