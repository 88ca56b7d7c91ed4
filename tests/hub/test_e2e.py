"""The README's examples end to end against the test Hub, Hub data read exactly like the same
files on local disk, local data beside an evicting cache, and a two-rank torch.distributed load
(pinning and request count)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.hub.hubdata import docs, fast_options, seed_datasets, sharded
from tests.kit.hub import hub_worker
from zephon import Pipeline
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.io.cache.shard_cache import cache_entries
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def test_readme_single_dataset(hub, tmp_path, tokenizer_dir):
    seed_datasets(hub)
    dataset = Dataset.from_path("fineweb_edu", "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    work_source = StaticMixtureWorkSource(
        datasets=[dataset],
        mixture=MixtureSpec({"fineweb_edu": 1.0}),
        seed=42,
    )
    cache = CacheOptions(enabled=True, root=str(tmp_path / "zephon-cache"), limit_bytes=50 << 30)
    pipeline = (
        Pipeline(work_source)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir, field="text")
        .pack_flat(max_length=129, algorithm="wrap")
        .batch(microbatch_size=8)
    )
    for batch in pipeline:
        tensors = batch.to_training(return_labels=True)
        assert tuple(tensors["input_ids"].shape) == (8, 128)
        assert tuple(tensors["labels"].shape) == (8, 128)
        break
    else:
        pytest.fail("the pipeline gave no batch")


def test_readme_mixture_by_tokens(hub, tmp_path, tokenizer_dir):
    seed_datasets(hub)
    work_source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("fineweb_edu", "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"),
            Dataset.from_path("wikipedia", "hf://wikimedia/wikipedia/20231101.en/train"),
        ],
        mixture=MixtureSpec({"fineweb_edu": 0.7, "wikipedia": 0.3}),
        seed=42,
        token_estimation=TokenEstimation(primer="measure", calibration_samples=2048,
                                         calibration_shards_max=4),
    )
    cache = CacheOptions(enabled=True, root=str(tmp_path / "zephon-cache"), limit_bytes=50 << 30)
    pipeline = (
        Pipeline(work_source)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir, field="text")
        .pack_flat(max_length=129, algorithm="wrap")
        .batch(microbatch_size=8)
    )
    for count, batch in enumerate(pipeline, start=1):
        assert tuple(batch.to_training(return_labels=True)["input_ids"].shape) == (8, 128)
        if count == 12:
            break
    report = pipeline.report()
    shares = {d.name: d.realized_share for d in report.datasets}
    assert report.mix_by == "tokens"
    assert shares["fineweb_edu"] == pytest.approx(0.7, abs=0.1)


def test_hub_and_local_copies_give_identical_batches(hub, tmp_path, tokenizer_dir):
    files = sharded(docs(200, seed=61), 5, "data/train-{i:05d}-of-{n:05d}.parquet", 9)
    hub.create("org/same", files)
    local = tmp_path / "local"
    for name, content in files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(content)

    def run(path):
        source = StaticMixtureWorkSource([Dataset.from_path("d", path)],
                                         mixture=MixtureSpec({"d": 1.0}), seed=7)
        pipeline = (Pipeline(source).options(io_options=fast_options(tmp_path / "cache"),
                                             lanes=4)
                    .tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=65)
                    .batch(microbatch_size=4))
        return [batch.to_training()["input_ids"].numpy() for batch in pipeline]

    from_hub, from_disk = run("hf://org/same/train"), run(str(local / "data"))
    assert len(from_hub) == len(from_disk) > 10
    assert all(np.array_equal(a, b) for a, b in zip(from_hub, from_disk, strict=True))


def test_eviction_never_touches_local_data(hub, tmp_path, tokenizer_dir):
    """Streaming #988 evicted the only copy of a dataset. Local files are read in place, never
    through the cache, and the cache evicts only shards it downloaded."""
    hub.create("org/remote", sharded(docs(120, seed=62), 4,
                                     "data/train-{i:05d}-of-{n:05d}.parquet", 8))
    local = tmp_path / "local"
    local.mkdir()
    for name, content in sharded(docs(80, seed=63), 3, "part-{i}.parquet", 8).items():
        (local / name).write_bytes(content)

    def digests():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in local.iterdir()}

    before = digests()
    root = tmp_path / "cache"
    shard = max(len(c) for c in hub.repos["org/remote"].commits[
        hub.repos["org/remote"].branches["main"]].values())
    source = StaticMixtureWorkSource(
        [Dataset.from_path("remote", "hf://org/remote/train"),
         Dataset.from_path("local", str(local))],
        mixture=MixtureSpec({"remote": 1.0, "local": 1.0}), seed=7, on_exhausted="drain")
    pipeline = (Pipeline(source).options(io_options=fast_options(root, limit_bytes=2 * shard),
                                         prefetch=0)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(4))
    assert sum(len(b) for b in pipeline) > 0
    assert pipeline.report().datasets[1].documents == 80
    assert digests() == before
    assert {e.display.split("/")[2] for e in cache_entries(root)} == {"org"}
    downloads = [r for r in hub.log("^/cdn/") if r.method == "GET" and r.range is None]
    assert len(downloads) > 4  # shards were evicted and downloaded again


@pytest.mark.multiprocess
@pytest.mark.parametrize("nodes", [1, 2], ids=["one-cache-root", "a-cache-root-per-rank"])
def test_two_ranks_pin_one_commit_and_count_requests(hub, tmp_path, nodes):
    """One rank lists the repository and reads the footers for the job, whether the ranks
    share a node's cache or each has its own (ranks on different nodes)."""
    shards = 20
    texts = docs(shards * 12, seed=71)
    repo = "org/twenty"
    hub.create(repo, sharded(texts, shards, "data/train-{i:05d}-of-{n:05d}.parquet", 4))
    pinned = hub.repos[repo].branches["main"]
    moved = sharded(docs(40, seed=72), 2, "data/train-{i:05d}-of-{n:05d}.parquet")
    # main moves right after the first rank has read it
    hub.after(r"/revision/main$", lambda: hub.push(repo, moved, delete=tuple(
        p for p in hub.repos[repo].commits[pinned] if p.startswith("data/"))))
    base = {"mode": "pipeline", "path": f"hf://{repo}/train", "cache": str(tmp_path / "node"),
            "world": 2, "lanes": 4, "distributed": True, "store": str(tmp_path / "store")}
    procs = [hub_worker({**base, "rank": r, "out": str(tmp_path / f"rank{r}.json"),
                      "cache": str(tmp_path / f"node{r % nodes}")}, hub)
             for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert hub.repos[repo].branches["main"] != pinned
    assert [r["commit"] for r in results] == [pinned, pinned]
    assert results[0]["fingerprint"] == results[1]["fingerprint"]
    ids = results[0]["ids"] + results[1]["ids"]
    assert sorted(ids) == sorted(f"{i}:{j}" for i in range(shards) for j in range(12))

    hub_requests = hub.log(r"^/(api/datasets|datasets|cdn)/")
    footers = [r for r in hub_requests if r.range and "/resolve/" in r.path]
    downloads = [r for r in hub_requests if not r.range and "/resolve/" in r.path]
    assert hub.count(r"/revision/") == 1 and hub.count(r"/tree/") == 1
    assert len(footers) == shards  # metadata: once for the job, whatever the caches
    assert len({r.path for r in downloads}) == shards
    if nodes == 1:  # one node's cache: each shard downloaded once
        assert len(downloads) == shards
        assert hub.count(r"^/cdn/") == 2 * shards  # each LFS resolve redirects to its content
    else:  # a cache per rank: at most once per cache (both ranks sample the first shards)
        assert len(downloads) <= nodes * shards
    print(f"\ntwo-rank load of {shards} shards: {len(hub_requests)} HTTP requests "
          f"({len(hub_requests) - hub.count('^/cdn/')} to the Hub API and resolve endpoints, "
          f"{hub.count('^/cdn/')} to content URLs after redirects)")


def test_resume_after_the_branch_moved_stays_on_the_checkpoint_commit(hub, tmp_path,
                                                                       tokenizer_dir, caplog):
    import pickle

    from zephon import StateMismatchError

    repo = "org/moving"
    first = hub.create(repo, sharded(docs(60, seed=81), 3, "data/train-{i:05d}-of-{n:05d}"
                                                           ".parquet", 8))

    def pipeline(**store):
        source = StaticMixtureWorkSource([Dataset.from_path("d", f"hf://{repo}/train")], seed=3)
        return (Pipeline(source).options(io_options=fast_options(tmp_path / "c", **store),
                                         lanes=2)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(65).batch(2))

    def digests(batches):
        return [b.records[0].payload["input_ids"].tobytes() for b in batches]

    uninterrupted = digests(pipeline())
    before = pipeline()
    iterator = iter(before)
    head = digests(next(iterator) for _ in range(3))
    state = pickle.loads(pickle.dumps(before.state_dict()))
    moved = hub.push(repo, sharded(docs(60, seed=82), 3, "data/train-{i:05d}-of-{n:05d}"
                                                         ".parquet", 8))
    assert moved != first
    with caplog.at_level("WARNING"):
        resumed = pipeline()
        resumed.load_state_dict(state)
        rest = digests(resumed)
    assert head + rest == uninterrupted
    assert f"is at commit {moved} now; the checkpoint was written at {first}" in caplog.text
    assert digests(pipeline()) != uninterrupted  # a fresh run reads the new commit
    strict = pipeline(resume_on_checkpoint_commit=False)
    with pytest.raises(StateMismatchError, match=f"checkpoint '{first}', now '{moved}'"):
        strict.load_state_dict(state)
