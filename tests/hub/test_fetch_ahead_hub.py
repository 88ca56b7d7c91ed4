"""Hub datasets fetch a lane's next units' files ahead, as the object stores do: the same
rows, each shard downloaded once, and the downloads in the background."""

from __future__ import annotations

from tests.hub.hubdata import docs, sharded
from tests.kit.object_stores import one_lane_with_fetches


def test_a_lane_fetches_its_next_shards_ahead_and_reads_the_same(hub, io_options, tmp_path,
                                                                 monkeypatch):
    shards = sharded(docs(120, seed=8), 6, "data/train-{i:05d}-of-{n:05d}.parquet",
                     row_group_size=20)
    hub.create("ahead/corpus", shards)
    for name, data in shards.items():
        (tmp_path / "local" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / name).write_bytes(data)
    dataset = one_lane_with_fetches(monkeypatch, "hf://ahead/corpus/train",
                                    tmp_path / "local" / "data", io_options)
    assert dataset.fetches.fetched >= len(shards) - 1
