"""Uploading to the test object-store servers, and a one-lane pipeline whose fetch-ahead is
watched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zephon.io import Dataset


def upload(server, bucket: str, root: Path, prefix: str = "") -> dict[str, bytes]:
    """Every file under ``root`` as an object ``prefix + relative path``."""
    objects = {prefix + str(p.relative_to(root)): p.read_bytes()
               for p in sorted(root.rglob("*")) if p.is_file()}
    server.bucket(bucket, objects)
    return objects


def one_lane_with_fetches(monkeypatch, remote: str, local: Path, options) -> Any:
    """Read ``remote`` and the same files under ``local`` through one lane each: they must
    give the same rows, and every ``fetch_ahead`` call of the remote dataset asks for at most
    the files of a lane's next ``FETCH_AHEAD`` units, and all of them in the end. Returns the
    remote dataset, its fetches waited for."""
    from zephon import Pipeline
    from zephon.engine.dataset_source import DatasetSource
    from zephon.io.fetch_ahead import FetchAhead
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    asked: list[list[str]] = []
    original = FetchAhead.fetch_ahead

    def recording(self, data_files):
        asked.append([f.path for f in data_files])
        original(self, data_files)

    def read(path, **options):
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)],
                                         MixtureSpec({"d": 1.0}), seed=2, repeat=False)
        pipeline = Pipeline(source).batch(4, drop_last=False).options(lanes=1, **options)
        return [r.payload["text"] for b in pipeline for r in b.records], pipeline

    with monkeypatch.context() as patched:
        patched.setattr(FetchAhead, "fetch_ahead", recording)
        rows, pipeline = read(remote, io_options=options)
    assert rows == read(str(local))[0]
    files = len(list(local.iterdir()))
    assert asked and all(0 < len(paths) <= DatasetSource.FETCH_AHEAD for paths in asked)
    assert len({p for paths in asked for p in paths}) >= files - 1
    dataset = pipeline.loader().source.datasets[0]
    dataset.wait_fetches()
    assert dataset.cache.stats.downloads == files  # each file once, either way
    return dataset
