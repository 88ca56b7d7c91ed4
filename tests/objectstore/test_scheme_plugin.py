"""A storage scheme registered from this module alone (``mem://``, objects in a dict) reads
through a pipeline exactly like the same files on local disk."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.core.test_elastic import build, run
from tests.hub.hubdata import fast_options
from zephon.errors import DataError
from zephon.io import storage
from zephon.io.storage import ObjectInfo, Scheme

BUCKETS: dict[str, dict[str, bytes]] = {}


class MemoryBucket:
    """A bucket held in :data:`BUCKETS`; the version is the MD5 of the content."""

    def __init__(self, bucket: str, io_options, *, latency: float = 0.0):
        self.url = f"mem://{bucket}"
        self.objects = BUCKETS[bucket]
        self.downloads: list[str] = []

    def _version(self, data: bytes) -> str:
        return "md5:" + hashlib.md5(data, usedforsecurity=False).hexdigest()

    def list(self, prefix: str) -> list[ObjectInfo]:
        return [ObjectInfo(k, len(v), self._version(v)) for k, v in self.objects.items()
                if k.startswith(prefix)]

    def _checked(self, info: ObjectInfo) -> bytes:
        data = self.objects[info.key]
        if self._version(data) != info.version:
            raise DataError(f"{self.url}/{info.key} changed")
        return data

    def read_range(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        return self._checked(info)[start:stop]

    def download(self, info, out, display, show_progress) -> None:
        self.downloads.append(info.key)
        out.write(self._checked(info))


@pytest.fixture
def mem_scheme():
    storage.register_scheme("mem", Scheme(MemoryBucket, options=("latency",)))
    yield BUCKETS
    storage.unregister_scheme("mem")
    BUCKETS.clear()


def test_a_registered_scheme_reads_like_local_files(mem_scheme, two_datasets, tokenizer_dir,
                                                    tmp_path):
    root: Path = two_datasets["short"].parent
    mem_scheme["toy"] = {str(p.relative_to(root)): p.read_bytes()
                         for p in sorted(root.rglob("*")) if p.is_file()}
    paths = {"short": "mem://toy/short/*.parquet", "long": "mem://toy/long"}
    remote = build(paths, tokenizer_dir).options(io_options=fast_options(tmp_path / "c"))
    reference = run(build(two_datasets, tokenizer_dir), 1, steps=5)
    assert run(remote, 1, steps=5) == reference
    assert run(remote, 2, steps=5) == reference
    assert storage.is_remote("mem://toy/x") and "mem" in storage.schemes()


def test_an_unregistered_scheme_is_refused_by_name(mem_scheme):
    from zephon.errors import ConfigError
    from zephon.io import Dataset

    storage.unregister_scheme("mem")
    with pytest.raises(ConfigError, match=r"mem:// is not a known storage scheme"):
        Dataset.from_path("d", "mem://toy/x.parquet")
    with pytest.raises(ConfigError, match="cannot be an object-store scheme"):
        storage.register_scheme("hf", Scheme(MemoryBucket))
