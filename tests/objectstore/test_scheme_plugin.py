"""A storage scheme registered from this module alone (``mem://``, objects in a dict) reads
through a pipeline exactly like the same files on local disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hub.hubdata import fast_options
from tests.kit.buckets import BUCKETS, MemoryBucket
from tests.kit.elastic import build, run
from zephon.io import storage
from zephon.io.storage import Scheme


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
