"""The shard cache: size limit and LRU eviction, pins, one download per node, interrupted
downloads, corrupted files."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.hub.hubdata import docs, fast_options, sharded
from tests.kit.hub import hub_worker, load, read_texts
from zephon import Pipeline
from zephon.errors import ConfigError, DataError
from zephon.io import CacheOptions, Dataset
from zephon.io.cache.shard_cache import CachedFile, ShardCache
from zephon.work import MixtureSpec, StaticMixtureWorkSource

ROOT = Path(__file__).resolve().parents[2]


def item(name: str, content: bytes) -> CachedFile:
    return CachedFile(name, len(content), "sha256:" + hashlib.sha256(content).hexdigest(), name)


def writer(content: bytes, calls: list[str] | None = None):
    def fetch(out):
        if calls is not None:
            calls.append(hashlib.sha256(content).hexdigest()[:8])
        out.write(content)
    return fetch


def test_lru_eviction_keeps_the_cache_within_its_limit(tmp_path):
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=3000))
    blobs = {n: bytes([n]) * 1000 for n in range(5)}
    for n in (0, 1, 2):
        with cache.open(item(f"f{n}", blobs[n]), writer(blobs[n])):
            pass
        time.sleep(0.01)
    with cache.open(item("f0", blobs[0]), writer(blobs[0])):  # f0 is now the most recent
        pass
    with cache.open(item("f3", blobs[3]), writer(blobs[3])) as path:
        assert Path(path).read_bytes() == blobs[3]
    names = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "shards").iterdir())
    assert names == ["f0", "f2", "f3"]  # f1 was the least recently used
    assert cache.used_bytes() <= 3000 and cache.stats.evictions == 1


def test_the_cache_keeps_one_small_state_file_a_shard(tmp_path):
    """Bookkeeping stays small: a pin (holding the shard's record) a shard, a fixed set of
    download locks, and the ledger; nothing is left of the reservations."""
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=1 << 20))
    blobs = [f"line {n}\n".encode() for n in range(300)]
    for n, blob in enumerate(blobs):
        with cache.open(item(f"f{n}.jsonl", blob), writer(blob)):
            pass
    assert len(list((tmp_path / "shards").iterdir())) == 300
    assert sorted(p.suffix for p in (tmp_path / "state").iterdir()) == [".pin"] * 300
    assert len(list((tmp_path / "locks").iterdir())) <= 256
    assert not any((tmp_path / "partial").iterdir())
    assert cache.used_bytes() == sum(map(len, blobs))
    fresh = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=1 << 20))
    for n, blob in enumerate(blobs):  # every record read back: no hashing, no download
        with fresh.open(item(f"f{n}.jsonl", blob), writer(b"never")):
            pass
    assert fresh.stats.hits == 300 and fresh.stats.downloads == 0


def test_a_changed_shard_record_is_not_believed(tmp_path):
    """A shard's record is a sealed artifact: one edited to match a changed shard (or
    written by hand) is not believed, and the shard is checked against its version again
    (here: it differs, so it is downloaded again)."""
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path))
    blob = b"the original bytes\n"
    with cache.open(item("f.jsonl", blob), writer(blob)) as path:
        shard = Path(path)
    [pin] = (tmp_path / "state").iterdir()
    record = json.loads(pin.read_bytes())
    assert record["artifact"] == "zephon.shard-record" and len(record["sha256"]) == 64
    shard.chmod(0o644)
    shard.write_bytes(b"THE ORIGINAL BYTES\n")  # same size
    stat = shard.stat()
    record.update(mtime_ns=stat.st_mtime_ns, ino=stat.st_ino)  # the record follows the edit
    pin.write_bytes(json.dumps(record).encode())
    calls: list[str] = []
    fresh = ShardCache(CacheOptions(enabled=True, root=tmp_path))
    with fresh.open(item("f.jsonl", blob), writer(blob, calls)) as path:
        assert Path(path).read_bytes() == blob
    assert calls  # the changed shard was not used as it was


def test_pinned_shards_are_never_evicted(tmp_path):
    options = CacheOptions(enabled=True, root=tmp_path, limit_bytes=2500, space_wait_s=0.3)
    cache = ShardCache(options)
    a, b, c = (bytes([n]) * 1000 for n in range(3))
    with cache.open(item("a", a), writer(a)) as path_a:
        with cache.open(item("b", b), writer(b)), \
                pytest.raises(DataError, match=r"is full.*Raise limit_bytes \(\[cache\] "
                                                  r"limit_bytes in a recipe, CacheOptions\."
                                                  r"limit_bytes in Python\)"), \
                cache.open(item("c", c), writer(c)):
            pass
        with cache.open(item("c", c), writer(c)):  # b is no longer read: it goes
            assert Path(path_a).read_bytes() == a
    with pytest.raises(ConfigError, match="more than the shard cache's limit_bytes"), \
            cache.open(item("big", b"x" * 3000), writer(b"x" * 3000)):
        pass


def test_a_reader_waiting_for_space_proceeds_when_a_pin_is_released(tmp_path):
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=1500,
                                    space_wait_s=10))
    a, b = b"a" * 1000, b"b" * 1000
    entered = threading.Event()
    order: list[str] = []

    def hold_a():
        with cache.open(item("a", a), writer(a)):
            entered.set()
            time.sleep(0.5)  # the other reader is waiting for space meanwhile
            order.append("a released")

    thread = threading.Thread(target=hold_a)
    thread.start()
    entered.wait()
    with cache.open(item("b", b), writer(b)) as path:
        order.append("b opened")
        assert Path(path).read_bytes() == b
    thread.join()
    assert order == ["a released", "b opened"]


def test_concurrent_readers_download_a_shard_once(tmp_path):
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=None))
    content = os.urandom(200_000)
    calls: list[str] = []

    def slow(out):
        time.sleep(0.2)
        writer(content, calls)(out)

    def read():
        with cache.open(item("s", content), slow) as path:
            assert Path(path).read_bytes() == content

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_a_failed_download_leaves_nothing_readable(tmp_path):
    cache = ShardCache(CacheOptions(enabled=True, root=tmp_path, limit_bytes=10_000))
    content = b"z" * 1000

    def broken(out):
        out.write(content[:400])
        raise DataError("connection lost")

    with pytest.raises(DataError), cache.open(item("z", content), broken):
        pass
    assert not any((tmp_path / "shards").iterdir())
    assert not any((tmp_path / "partial").iterdir())
    assert not list((tmp_path / "partial").glob("*.reserve"))


def _pipeline(dataset, options, lanes=2):
    source = StaticMixtureWorkSource([dataset], mixture=MixtureSpec({"d": 1.0}), seed=5)
    return (Pipeline(source).options(io_options=options, lanes=lanes)
            .batch(microbatch_size=4, drop_last=False))


def test_limit_holds_under_eviction_while_a_pipeline_runs(hub, tmp_path):
    texts = docs(240, seed=51, words=(40, 120))
    hub.create("org/big", sharded(texts, 8, "data/train-{i:05d}-of-{n:05d}.parquet", 5))
    sizes = [len(c) for r in hub.repos.values() for c in next(iter(r.commits.values())).values()]
    limit = 3 * max(sizes)
    small = fast_options(tmp_path / "small", limit_bytes=limit)
    dataset = Dataset.from_path("d", "hf://org/big/train")
    pipeline = _pipeline(dataset, small)
    peak = [0]
    stop = threading.Event()

    def size(path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:  # evicted between listing and stat
            return 0

    def watch():
        while not stop.is_set():
            shards = tmp_path / "small" / "shards"
            peak[0] = max(peak[0], sum(size(p) for p in shards.glob("*")))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        limited = [r.payload["id"] for batch in pipeline for r in batch.records]
    finally:
        stop.set()
        watcher.join()
    assert peak[0] <= limit
    cache = pipeline.loader().source.datasets[0].cache  # the copy bound to `small`
    assert dataset._cache is None  # the user's dataset object is left unchanged
    assert cache.stats.evictions > 0
    assert cache.stats.downloads > 8  # evicted shards came back when needed again
    roomy = _pipeline(Dataset.from_path("d", "hf://org/big/train"),
                      fast_options(tmp_path / "roomy"))
    assert limited == [r.payload["id"] for batch in roomy for r in batch.records]
    assert sorted(limited) == sorted(f"{i}:{j}" for i in range(8) for j in range(30))


@pytest.mark.multiprocess
def test_two_processes_download_each_shard_once(hub, tmp_path):
    texts = docs(120, seed=52)
    hub.create("org/shared", sharded(texts, 6, "data/train-{i:05d}-of-{n:05d}.parquet", 8))
    hub.throttle(r"/cdn/", 400_000)
    args = {"mode": "pipeline", "path": "hf://org/shared/train", "cache": str(tmp_path / "c")}
    procs = [hub_worker({**args, "out": str(tmp_path / f"out{i}.json")}, hub) for i in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert results[0]["ids"] == results[1]["ids"] and len(results[0]["ids"]) == 120
    downloads = [r.path for r in hub.log("/cdn/") if not r.range]
    assert len(downloads) == 6 == len(set(downloads))
    assert sum(r["downloads"] for r in results) == 6
    assert hub.count("/tree/") == 1


@pytest.mark.multiprocess
def test_a_killed_download_is_never_used(hub, tmp_path):
    texts = docs(400, seed=53, words=(200, 400))
    hub.create("org/slow", sharded(texts, 2, "data/train-{i:05d}-of-{n:05d}.parquet", 50))
    shard = next(p for p in hub.repos["org/slow"].commits[hub.repos["org/slow"]
                                                          .branches["main"]]
                 if p.endswith("00000-of-00002.parquet"))
    size = len(hub.repos["org/slow"].commits[hub.repos["org/slow"].branches["main"]][shard])
    hub.throttle(r"/cdn/.*00000-of-00002", size / 4)
    cache_root = tmp_path / "c"
    proc = hub_worker({"mode": "open", "path": "hf://org/slow/train", "cache": str(cache_root)},
                   hub)
    partial = cache_root / "partial"
    deadline = time.monotonic() + 30
    while not (partial.exists() and any(p.stat().st_size > 0 for p in partial.iterdir())):
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not any((cache_root / "shards").iterdir())
    assert list(partial.glob("*.reserve")) and list(partial.glob("*.parquet"))
    hub._throttles.clear()
    # a limit that fits one shard plus the dead download's reservation only if it is dropped
    second_size = max(len(c) for c in hub.repos["org/slow"].commits[
        hub.repos["org/slow"].branches["main"]].values())
    dataset = load("hf://org/slow/train", fast_options(cache_root,
                                                       limit_bytes=size + second_size))
    assert sorted(read_texts(dataset)) == sorted(texts)
    assert not any(partial.iterdir())
    assert not list(partial.glob("*.reserve"))


def test_a_corrupted_cached_shard_is_detected_and_replaced(hub, io_options):
    texts = docs(60, seed=54)
    hub.create("org/fragile", sharded(texts, 2, "data/train-{i:05d}-of-{n:05d}.parquet"))
    dataset = load("hf://org/fragile/train", io_options)
    assert sorted(read_texts(dataset)) == sorted(texts)
    shards = sorted((Path(io_options.cache.root) / "shards").iterdir())
    flipped = bytearray(shards[0].read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    shards[0].write_bytes(bytes(flipped))  # same size, different bytes
    with open(shards[1], "r+b") as fh:
        fh.truncate(100)
    fresh = load("hf://org/fragile/train", io_options)
    assert sorted(read_texts(fresh)) == sorted(texts)
    assert fresh.cache.stats.discarded == 2 and fresh.cache.stats.downloads == 2
    downloads = [r.path for r in hub.log("/cdn/") if not r.range]
    assert len(downloads) == 4
    again = load("hf://org/fragile/train", io_options)
    read_texts(again)
    assert again.cache.stats.downloads == 0 and again.cache.stats.discarded == 0


def test_a_quick_download_logs_at_debug_only(hub, tmp_path, caplog):
    """One line a download is noise: a quick download logs its bytes and time at DEBUG; INFO
    is for the progress of slow ones."""
    hub.create("org/logged", sharded(docs(20, seed=55), 1, "train.parquet"))
    dataset = load("hf://org/logged/train", fast_options(tmp_path / "c", show_progress=True))
    size = dataset.files()[0].size
    with caplog.at_level(logging.DEBUG, logger="zephon.io.hub"), \
            dataset.local_file(dataset.files()[0]):
        pass
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("downloading hf://org/logged@") for m in messages)
    assert any(re.search(rf"downloaded hf://org/logged@\w+/train.parquet: {size} bytes in "
                         r"[\d.]+ s \([\d.]+ \w+/s\)", m) for m in messages), messages


@pytest.mark.multiprocess
def test_ctrl_c_during_a_slow_download_exits_promptly_and_cleans_up(hub, tmp_path):
    texts = docs(400, seed=55, words=(200, 400))
    hub.create("org/crawl", sharded(texts, 2, "data/train-{i:05d}-of-{n:05d}.parquet", 50))
    hub.throttle(r"/cdn/", 50_000)  # a shard takes about a minute
    cache_root = tmp_path / "c"
    proc = hub_worker({"mode": "pipeline", "path": "hf://org/crawl/train", "cache": str(cache_root),
                    "prefetch": 2, "out": str(tmp_path / "out.json")}, hub)
    partial = cache_root / "partial"
    deadline = time.monotonic() + 30
    while not (partial.exists() and any(p.stat().st_size > 0 for p in partial.iterdir())):
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.02)
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.monotonic() - interrupted < 10  # the download alone takes a minute
    assert proc.returncode != 0
    assert not any(partial.iterdir())  # the partial download was removed
    assert not list(partial.glob("*.reserve"))


def test_disk_full_and_read_only_roots_name_the_cache(tmp_path):
    import errno

    cache = ShardCache(CacheOptions(enabled=True, root=str(tmp_path / "c"), limit_bytes=10 << 30))
    item = CachedFile("train.parquet", 1 << 20, "sha256:" + "ab" * 32, "org/x: train.parquet")

    def full(out):
        out.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DataError) as info, cache.open(item, full):
        pass
    message = str(info.value)
    assert str(tmp_path / "c") in message and "org/x: train.parquet" in message
    assert "limit_bytes=10737418240 is more than the disk holds" in message
    assert not any((tmp_path / "c" / "partial").iterdir())
    with pytest.raises(ConfigError, match=r"shard cache root /sys/zephon-cache cannot be "
                                          r"written .*writable directory"):
        ShardCache(CacheOptions(enabled=True, root="/sys/zephon-cache"))
