"""Object-store datasets against real protocol servers on 127.0.0.1 (moto's S3 server,
fake-gcs-server): the same batches as local files, exact resume, retries, named errors and a
bounded, node-shared cache."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.hub.hubdata import fast_options
from tests.kit.elastic import build, merged_state, run, stream
from tests.kit.object_stores import one_lane_with_fetches, upload
from tests.objectstore.servers import KEY_ID, SECRET, Fault, refused_endpoint
from zephon import StateMismatchError
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.io.formats import PlanHints


def stored_corpus(scheme: str, server, two_datasets, test_name: str) -> dict:
    """``two_datasets`` stored locally and in a bucket of its own; returns both paths."""
    bucket = "corpus-" + "".join(c for c in test_name.lower().replace("_", "-")
                                 if c.isalnum() or c == "-")[:40].strip("-")
    upload(server, bucket, two_datasets["short"].parent)
    remote = {"short": f"{scheme}://{bucket}/short/*.parquet",
              "long": f"{scheme}://{bucket}/long/"}
    return {"local": two_datasets, "s3": remote, "bucket": bucket, "server": server}


@pytest.fixture
def corpus(store, two_datasets, request):
    """The corpus in each object store (s3 and gs)."""
    return stored_corpus(*store, two_datasets, request.node.name)


@pytest.fixture
def s3_corpus(s3, two_datasets, request):
    """The corpus in S3 only (the fault proxy is an S3 proxy)."""
    return stored_corpus("s3", s3, two_datasets, request.node.name)


def test_object_stores_give_the_local_batches_at_w1_and_w2(corpus, tokenizer_dir, tmp_path):
    local = build(corpus["local"], tokenizer_dir)
    remote = build(corpus["s3"], tokenizer_dir).options(
        io_options=fast_options(tmp_path / "cache"))
    reference = run(local, 1, steps=6)
    assert run(remote, 1, steps=6) == reference
    assert run(remote, 2, steps=6) == reference


def test_object_stores_resume_exactly_at_another_dp_size(corpus, tokenizer_dir, tmp_path):
    options = fast_options(tmp_path / "cache")
    remote = build(corpus["s3"], tokenizer_dir).options(io_options=options)
    reference = run(build(corpus["local"], tokenizer_dir), 1, steps=7)
    pipelines, first = stream(remote, 2, 0, 3)
    state = merged_state(pipelines)
    fresh = build(corpus["s3"], tokenizer_dir).options(io_options=options)
    _, rest = stream(fresh, 1, 0, 4, state)
    assert first + rest == reference


def test_a_checkpoint_over_a_changed_object_is_refused_naming_it(corpus, tokenizer_dir,
                                                                 tmp_path):
    options = fast_options(tmp_path / "cache")
    remote = build(corpus["s3"], tokenizer_dir).options(io_options=options)
    pipelines, _ = stream(remote, 1, 0, 2)
    state = merged_state(pipelines)
    corpus["server"].put(corpus["bucket"], {"short/part-1.parquet": (
        corpus["local"]["short"] / "part-0.parquet").read_bytes()})
    fresh = build(corpus["s3"], tokenizer_dir).options(io_options=options)
    with pytest.raises(StateMismatchError, match=r"objects\.part-1\.parquet"):
        stream(fresh, 1, 0, 1, state)


def test_an_object_rewritten_during_the_run_is_an_error_naming_it(corpus, tmp_path):
    dataset = Dataset.from_path("short", corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    files = dataset.files()
    corpus["server"].put(corpus["bucket"], {files[0].path: b"PAR1 rewritten"})
    changed = r"(changed since it was listed|do not match its MD5).*short/part-0\.parquet"
    with pytest.raises(DataError, match=changed), dataset.local_file(files[0]):
        pass


def test_listing_matches_globs_skips_and_counts_other_keys(s3, tmp_path):
    from tests.hub.hubdata import docs, sharded

    objects = sharded(docs(40, seed=3), 4, "data/part-{i}.parquet")
    objects.update({"data/README.md": b"# corpus", "data/.hidden.parquet": b"x",
                    "data/sub/more.jsonl": b'{"text": "a"}\n', "other/x.parquet": b"x"})
    s3.bucket("listing", objects)
    options = fast_options(tmp_path / "cache")
    folder = Dataset.from_path("d", "s3://listing/data").bound(options)
    assert [f.path for f in folder.files()] == [
        "data/part-0.parquet", "data/part-1.parquet", "data/part-2.parquet",
        "data/part-3.parquet", "data/sub/more.jsonl"]
    assert sorted(folder.skipped_files()) == ["s3://listing/data/.hidden.parquet (hidden)",
                                              "s3://listing/data/README.md (not a data file)"]
    glob = Dataset.from_path("d", "s3://listing/data/*.parquet").bound(options)
    assert [f.path for f in glob.files()] == [f"data/part-{i}.parquet" for i in range(4)]
    assert [f.row_groups for f in glob.files()] == [(10,)] * 4
    deep = Dataset.from_path("d", "s3://listing/**/*.jsonl").bound(options)
    assert [f.path for f in deep.files()] == ["data/sub/more.jsonl"]
    with pytest.raises(DataError, match=r"no objects match 's3://listing/nothing/\*'"):
        Dataset.from_path("d", "s3://listing/nothing/*").bound(options).files()


def test_one_key_a_folder_and_a_glob_each_name_their_objects(store, tmp_path, request):
    """``scheme://bucket/chat/chat.jsonl`` is that one object, though the store lists by whole
    path segments; the folder and the glob forms still list theirs."""
    scheme, server = store
    bucket = f"keys-{request.node.callspec.id}"
    chat = b'{"text": "hello"}\n{"text": "world"}\n'
    server.bucket(bucket, {"chat/chat.jsonl": chat, "chat/chat.jsonl.old/x.jsonl": b"{}\n",
                           "chat/more.jsonl": b'{"text": "more"}\n'})
    options = fast_options(tmp_path / "cache")
    one = Dataset.from_path("d", f"{scheme}://{bucket}/chat/chat.jsonl").bound(options)
    assert [(f.path, f.size) for f in one.files()] == [("chat/chat.jsonl", len(chat))]
    with one.local_file(one.files()[0]) as local:
        assert Path(local).read_bytes() == chat
    folder = Dataset.from_path("d", f"{scheme}://{bucket}/chat").bound(options)
    assert [f.path for f in folder.files()] == ["chat/chat.jsonl", "chat/chat.jsonl.old/x.jsonl",
                                               "chat/more.jsonl"]
    glob = Dataset.from_path("d", f"{scheme}://{bucket}/chat/*.jsonl").bound(options)
    assert [f.path for f in glob.files()] == ["chat/chat.jsonl", "chat/more.jsonl"]
    with pytest.raises(DataError, match=r"no objects match .*chat/chat\.json'"):
        Dataset.from_path("d", f"{scheme}://{bucket}/chat/chat.json").bound(options).files()


def test_throttling_and_server_errors_are_retried(s3_corpus, proxy, tmp_path, caplog):
    proxy.faults += [Fault(r"^GET /corpus[^/?]*\?list-type", 503, "SlowDown", times=2),
                     Fault(r"^GET /corpus[^?]*/short/part-0\.parquet", 500, "InternalError"),
                     Fault(r"^GET /corpus[^?]*/short/part-1\.parquet", 503, "SlowDown",
                           times=3)]
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    files = dataset.files()
    for data_file in files:
        with dataset.local_file(data_file) as local:
            assert Path(local).read_bytes() == (
                s3_corpus["local"]["short"] / Path(data_file.path).name).read_bytes()
    assert [f.hits for f in proxy.faults] == [2, 1, 3]
    assert "HTTP 503; retry 1 of 3" in caplog.text


def test_retries_give_up_after_max_retries_naming_the_request(s3_corpus, proxy, tmp_path):
    proxy.faults.append(Fault(r"list-type", 503, "SlowDown", times=None))
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache", max_retries=2))
    with pytest.raises(DataError, match=r"listing s3://corpus[^ ]*/short/: failed after 2 "
                                        r"retries"):
        dataset.files()
    assert proxy.count("list-type") == 3


def test_a_connection_reset_mid_download_resumes_from_the_bytes_received(s3_corpus, proxy,
                                                                          tmp_path):
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    first = dataset.files()[0]
    proxy.faults.append(Fault(r"^GET /corpus[^?]*/short/part-0\.parquet", reset_after=3000))
    before = len(proxy.requests)
    with dataset.local_file(first) as local:
        assert Path(local).read_bytes() == (s3_corpus["local"]["short"]
                                            / "part-0.parquet").read_bytes()
    assert proxy.faults[0].hits == 1
    assert proxy.count("part-0.parquet") >= 2 and len(proxy.requests) - before == 2
    assert dataset.cache.stats.downloaded_bytes == first.size


@pytest.mark.parametrize("scheme, variable, credentials", [
    ("s3", "AWS_ENDPOINT_URL_S3", r"the environment \(AWS_ACCESS_KEY_ID\)"),
    ("gs", "STORAGE_EMULATOR_HOST", r"none \(STORAGE_EMULATOR_HOST names an emulator\)"),
    ("az", "AZURE_STORAGE_ENDPOINT", r"account devstoreaccount1, the environment "
                                     r"\(AZURE_STORAGE_ACCOUNT_KEY\)"),
], ids=["s3", "gs", "az"])
def test_a_refused_endpoint_fails_within_seconds_naming_it_and_the_credentials(
        scheme, variable, credentials, monkeypatch, tmp_path):
    """A mistyped endpoint (nothing listens there) is not an outage to wait out: with the
    default retry settings, whose backoff takes minutes, the error comes within seconds."""
    from tests.objectstore.servers import azure_environment, s3_environment
    from zephon.io import CacheOptions, StoreOptions

    with refused_endpoint() as url:
        if scheme == "s3":
            s3_environment(monkeypatch, tmp_path, url)
        elif scheme == "az":
            azure_environment(monkeypatch, type("Down", (), {"endpoint": url})())
        monkeypatch.setenv(variable, url)
        options = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "c")),
                               show_progress=False)
        dataset = Dataset.from_path("d", f"{scheme}://corpus/web/*.parquet").bound(options)
        started = time.monotonic()
        with pytest.raises(DataError) as info:
            dataset.files()
        assert time.monotonic() - started < 15
    message = str(info.value)
    assert f"cannot connect to {url} ({variable})" in message
    assert "connection refused" in message
    assert re.search(f"credentials: {credentials}", message), message


@pytest.mark.parametrize("status, code, message", [
    (403, "AccessDenied", r"access denied \(bucket s3://corpus[^,]*, key 'short/part-2\."
                          r"parquet'\)\. Credentials used: the environment \(AWS_ACCESS_KEY_ID"
                          r"\) at http://127\.0\.0\.1:\d+"),
    (404, "NoSuchKey", r"no such object \(bucket s3://corpus[^,]*, key 'short/part-2\."
                       r"parquet'\)"),
])
def test_denied_and_missing_objects_are_named(s3_corpus, proxy, tmp_path, status, code,
                                              message):
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    files = dataset.files()
    proxy.faults.append(Fault(r"part-2\.parquet", status, code, times=None))
    with pytest.raises(DataError, match=message), dataset.local_file(files[2]):
        pass
    assert proxy.count(r"part-2\.parquet") == 2  # no retries: the listing's read, then this


def test_a_disk_that_fills_during_a_download_is_named_with_the_cache_root(s3, proxy, tmp_path):
    """The disk fills while an object downloads (checked free before): the error names the
    object, the cache root and what to change, for recipe and Python users, not a raw
    ``OSError: [Errno 28]``."""
    import threading

    from tests.hub.disks import fill, small_disk

    s3.bucket("filling", {"big/x.jsonl": b'{"text": "%s"}\n' % (b"x" * 400_000)})
    with small_disk(tmp_path) as disk:
        dataset = Dataset.from_path("d", "s3://filling/big/").bound(
            fast_options(disk / "c"))
        data_file = dataset.files()[0]
        fault = Fault(r"^GET /filling/big/x\.jsonl", hold_after=128 << 10)
        proxy.faults.append(fault)
        failure: list[BaseException] = []

        def download() -> None:
            try:
                with dataset.local_file(data_file):
                    pass
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=download)
        thread.start()
        partial = disk / "c" / "partial"
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 0 for p in partial.glob("*.jsonl")):
            assert time.monotonic() < deadline and thread.is_alive(), failure
            time.sleep(0.01)
        fill(disk)
        fault.release.set()
        thread.join(60)
        assert len(failure) == 1 and isinstance(failure[0], DataError), failure
        message = str(failure[0])
        assert "partial download of s3://filling/big/x.jsonl" in message
        assert "the disk is full" in message and f"shard cache root {disk / 'c'}" in message
        assert "[cache] limit_bytes in a recipe, CacheOptions.limit_bytes in Python" in message
        assert not any(partial.iterdir())


def test_keys_the_client_cannot_request_are_skipped_and_named_escaped(s3, tmp_path):
    """S3 allows any key; obstore refuses a whole listing page over one with an empty or a
    '.'/'..' segment or a control character. Such keys are skipped and reported (escaped);
    every other key under the prefix, before them in the same page too, is read."""
    good = {f"data/{name}.jsonl": b'{"text": "%s"}\n' % name.encode()
            for name in ("a", "b", "m", "z")}
    s3.bucket("odd", {**good, "data/x//empty.jsonl": b"{}\n", "data/../up.jsonl": b"{}\n",
                      "data/ctl\x01\x1b[31m.jsonl": b"{}\n"})
    dataset = Dataset.from_path("d", "s3://odd/data/").bound(fast_options(tmp_path / "c"))
    assert [f.path for f in dataset.files()] == sorted(good)
    assert sorted(dataset.skipped_files()) == [
        "s3://odd/data/../up.jsonl (its key has a '.' or '..' path segment, which the "
        "object-store client cannot request)",
        "s3://odd/data/ctl\\x01\\x1b[31m.jsonl (its key has a control character, which the "
        "object-store client cannot request)",
        "s3://odd/data/x//empty.jsonl (its key has an empty path segment (//), which the "
        "object-store client cannot request)"]
    for data_file in dataset.files():
        with dataset.local_file(data_file) as local:
            assert Path(local).read_bytes() == good[data_file.path]


def test_a_key_gcs_cannot_list_around_is_named_escaped(gs, tmp_path):
    gs.bucket("odd-gs", {"data/a.jsonl": b'{"text": "a"}\n', "data/x//b.jsonl": b"{}\n"})
    with pytest.raises(DataError) as info:
        Dataset.from_path("d", "gs://odd-gs/data/").bound(fast_options(tmp_path / "c")).files()
    assert ("listing gs://odd-gs/data/: the key 'data/x//b.jsonl' has an empty path segment "
            "(//), which the object-store client cannot request") in str(info.value)


@pytest.mark.parametrize("scheme", ["s3", "az"])  # fake-gcs-server answers 500, not 404
def test_a_missing_bucket_is_named_as_such(scheme, request, tmp_path):
    request.getfixturevalue(scheme)
    with pytest.raises(DataError) as info:
        Dataset.from_path("d", f"{scheme}://no-such-bucket/data/").bound(
            fast_options(tmp_path / "c")).files()
    message = str(info.value)
    assert f"the bucket {scheme}://no-such-bucket does not exist" in message
    assert "deleted or renamed since it was listed" not in message


def test_a_wrong_secret_is_named_as_such_not_as_access_denied(monkeypatch, tmp_path):
    """With authentication on (moto checks signatures of its IAM users' keys), a wrong secret
    is SignatureDoesNotMatch and an unknown key id InvalidAccessKeyId, each named."""
    import json as json_module
    import urllib.request

    import boto3

    from tests.objectstore.servers import REGION, S3Server, s3_environment

    def authentication(count: bytes) -> None:
        """Check signatures after ``count`` more requests (moto's setting is process-wide:
        ``inf`` turns the checks off again for the other tests)."""
        urllib.request.urlopen(urllib.request.Request(
            server.url + "/moto-api/reset-auth", data=count, method="POST",
            headers={"Content-Type": "text/plain"}), timeout=30).read()

    server = S3Server()
    try:
        server.bucket("locked", {"data/a.jsonl": b'{"text": "a"}\n'})
        iam = boto3.client("iam", endpoint_url=server.url, region_name=REGION,
                           aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json_module.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        authentication(b"0")
        s3_environment(monkeypatch, tmp_path, server.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])

        def listing() -> Any:
            return Dataset.from_path("d", "s3://locked/data/").bound(
                fast_options(tmp_path / "c")).files()

        assert [f.path for f in listing()] == ["data/a.jsonl"]  # the right secret reads
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        with pytest.raises(DataError) as info:
            listing()
        message = str(info.value)
        assert "the signature does not match: the secret key is wrong for this access key id" \
            in message and "SignatureDoesNotMatch" in message
        assert "access denied" not in message and "not-the-secret" not in message
        assert "Credentials used: the environment (AWS_ACCESS_KEY_ID)" in message
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY")
        with pytest.raises(DataError, match="the store knows no such access key id"):
            listing()
    finally:
        authentication(b"inf")
        server.close()


def test_credentials_come_from_the_profile_files(s3_corpus, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    endpoint = os.environ.pop("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(f"[training]\naws_access_key_id = {KEY_ID}\n"
                           f"aws_secret_access_key = {SECRET}\n")
    config = tmp_path / "aws-config"
    config.write_text(f"[profile training]\nregion = us-east-1\nendpoint_url = {endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"], profile="training").bound(
        fast_options(tmp_path / "cache"))
    assert len(dataset.files()) == 3
    assert dataset.store.credentials == (f"profile 'training' of {credentials} at "
                                         f"{endpoint}")
    with pytest.raises(ConfigError, match="s3 profile 'nobody' is in neither"):
        Dataset.from_path("short", s3_corpus["s3"]["short"], profile="nobody").bound(
            fast_options(tmp_path / "cache")).files()


def test_gcs_credentials_are_named_and_a_missing_key_file_refused(gs, two_datasets, request,
                                                                  monkeypatch, tmp_path):
    corpus = stored_corpus("gs", gs, two_datasets, request.node.name)
    dataset = Dataset.from_path("short", corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    assert len(dataset.files()) == 3
    assert dataset.store.credentials == (f"none (STORAGE_EMULATOR_HOST names an emulator) at "
                                         f"{gs.url}")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"service-account key file '.*missing\.json' "
                                          r"\(GOOGLE_APPLICATION_CREDENTIALS\) does not exist"):
        Dataset.from_path("short", corpus["s3"]["short"]).bound(
            fast_options(tmp_path / "cache")).files()


def test_a_cache_of_three_shards_reads_twenty_and_stays_under_its_limit(s3, tmp_path,
                                                                        tokenizer_dir):
    from tests.hub.hubdata import docs, sharded
    from zephon import Pipeline
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    objects = sharded(docs(200, seed=5), 20, "shards/{i:02d}.parquet", row_group_size=5)
    s3.bucket("twenty", objects)
    limit = 3 * max(len(b) for b in objects.values())
    options = fast_options(tmp_path / "cache", limit_bytes=limit)
    source = StaticMixtureWorkSource([Dataset.from_path("d", "s3://twenty/shards/*.parquet")],
                                     MixtureSpec({"d": 1.0}), seed=1, repeat=False)
    pipeline = (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(64, "wrap")
                .batch(2).options(io_options=options, lanes=2))
    cache_root = tmp_path / "cache" / "shards"
    peak = 0
    read = []
    for batch in pipeline:
        read.extend(r.payload["input_ids"].tobytes() for r in batch.records)
        peak = max(peak, cached_bytes(cache_root))
    assert 0 < peak <= limit
    local = tmp_path / "local"
    for key, data in objects.items():
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(data)
    source = StaticMixtureWorkSource([Dataset.from_path("d", local / "shards")],
                                     MixtureSpec({"d": 1.0}), seed=1, repeat=False)
    expected = [r.payload["input_ids"].tobytes()
                for batch in (Pipeline(source).tokenize(tokenizer_id=tokenizer_dir)
                              .pack_flat(64, "wrap").batch(2).options(lanes=2))
                for r in batch.records]
    assert read == expected and len(read) > 20


def cached_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder`` now (one evicted while it is summed counts 0)."""
    total = 0
    for entry in os.scandir(folder):
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat().st_size
    return total


def test_unknown_schemes_and_options_are_config_errors():
    with pytest.raises(ConfigError, match=r"gcsx:// is not a known storage scheme \(known: "
                                          r"az://, gs://, hf://, s3://"):
        Dataset.from_path("d", "gcsx://bucket/x.parquet")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['token'\] for a s3:// "
                                          r"dataset \(known: endpoint, region, profile\)"):
        Dataset.from_path("d", "s3://bucket/x.parquet", token="t")
    with pytest.raises(ConfigError, match="shard cache, which is not enabled"):
        from zephon.io import StoreOptions

        Dataset.from_path("d", "s3://bucket/x.parquet").bound(StoreOptions())


def test_planning_reads_only_footers(s3_corpus, proxy, tmp_path):
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    dataset.plan(PlanHints(1 << 20, 1000), 8)
    gets = [r for r in proxy.requests if r.startswith("GET") and "list-type" not in r]
    assert len(gets) == 3 and proxy.count("list-type") == 1
    assert dataset.cache.stats.downloads == 0


def worker(args: dict, tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.objectstore.worker",
                             json.dumps({**args, "out": str(out)})], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    return proc, out


@pytest.mark.multiprocess
def test_eight_processes_sharing_a_cache_download_each_object_once(s3, tmp_path):
    from tests.hub.hubdata import docs, sharded

    objects = sharded(docs(160, seed=9), 8, "d/{i}.parquet", row_group_size=10)
    s3.bucket("shared", objects)
    cache = tmp_path / "cache"
    procs = [worker({"path": "s3://shared/d/*.parquet", "cache": str(cache)}, tmp_path,
                    f"w{i}") for i in range(8)]
    results = []
    for proc, out in procs:
        assert proc.wait(timeout=300) == 0
        results.append(json.loads(out.read_text()))
    assert sum(r["downloads"] for r in results) == len(objects)
    assert sum(r["downloaded_bytes"] for r in results) == sum(map(len, objects.values()))
    assert all(r["ids"] == results[0]["ids"] for r in results)
    assert sorted(results[0]["ids"]) == sorted(f"{i}:{j}" for i in range(8) for j in range(20))


@pytest.mark.multiprocess
def test_ctrl_c_during_a_slow_download_exits_within_two_seconds(s3, proxy, tmp_path):
    from tests.hub.hubdata import docs, sharded

    objects = sharded(docs(800, seed=55, words=(200, 400)), 2, "slow/{i}.parquet", 50)
    s3.bucket("slow", objects)
    proxy.faults.append(Fault(r"^GET /slow/slow/0\.parquet$", bytes_per_s=100_000, times=None))
    cache = tmp_path / "cache"
    proc, _ = worker({"path": "s3://slow/slow/*.parquet", "cache": str(cache), "prefetch": 2},
                     tmp_path, "slow")
    partial = cache / "partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and any(p.stat().st_size > 0 for p in partial.iterdir())):
        assert time.monotonic() < deadline and proc.poll() is None, "no download started"
        time.sleep(0.02)
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.monotonic() - interrupted < 10  # the download alone takes a minute
    assert proc.returncode != 0
    assert not any(partial.iterdir())
    assert not list(partial.glob("*.reserve"))


def _job(world: int, tmp_path: Path, path: str) -> list[dict]:
    procs = [worker({"path": path, "cache": str(tmp_path / f"w{world}-node{r}"), "lanes": 8,
                     "world": world, "rank": r, "store": str(tmp_path / f"store-{world}")},
                    tmp_path, f"w{world}-rank{r}") for r in range(world)]
    results = []
    for proc, out in procs:
        assert proc.wait(timeout=300) == 0
        results.append(json.loads(out.read_text()))
    return results


@pytest.mark.multiprocess
def test_four_ranks_on_four_nodes_list_and_read_footers_once_for_the_job(s3, proxy,
                                                                          tmp_path):
    from tests.hub.hubdata import docs, sharded

    objects = sharded(docs(240, seed=4), 40, "web/{i:02d}.parquet", row_group_size=6)
    s3.bucket("jobs", objects)
    seen = {}
    for world in (1, 4):
        before = len(proxy.requests)
        results = _job(world, tmp_path, "s3://jobs/web/*.parquet")
        requests = proxy.requests[before:]
        downloads = sum(r["downloads"] for r in results)
        metadata = [r for r in requests if "list-type" in r or "Range:" in r]
        assert len([r for r in requests if r.startswith("GET")]) == len(metadata) + downloads
        batches = {k: v for r in results for k, v in r["batches"].items()}
        seen[world] = (len(metadata), batches, downloads)
    (one_meta, one, one_downloads), (four_meta, four, four_downloads) = seen[1], seen[4]
    assert one_meta == 1 + len(objects)  # one listing, one footer read an object
    assert four_meta <= 1.3 * one_meta, (four_meta, one_meta)
    assert four == one
    assert one_downloads == len(objects) and four_downloads <= 1.3 * len(objects)


def test_a_lane_fetches_its_next_units_files_ahead_and_reads_the_same(s3, tmp_path,
                                                                     monkeypatch):
    from tests.hub.hubdata import docs, sharded

    objects = sharded(docs(120, seed=8), 6, "ahead/{i}.parquet", row_group_size=20)
    s3.bucket("ahead", objects)
    for key, data in objects.items():
        (tmp_path / "local" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / key).write_bytes(data)
    one_lane_with_fetches(monkeypatch, "s3://ahead/ahead/*.parquet", tmp_path / "local" / "ahead",
                          fast_options(tmp_path / "cache"))


def test_fetch_ahead_downloads_in_the_background_once(s3_corpus, tmp_path):
    dataset = Dataset.from_path("short", s3_corpus["s3"]["short"]).bound(
        fast_options(tmp_path / "cache"))
    files = dataset.files()
    dataset.fetch_ahead(list(files))
    dataset.fetch_ahead(list(files))
    dataset.wait_fetches()
    assert dataset.cache.stats.downloads == len(files) == dataset.fetches.fetched
    with dataset.local_file(files[1]):
        pass
    assert dataset.cache.stats.hits == 1


def test_small_objects_are_fetched_ahead_several_at_a_time_and_no_more(s3, proxy, tmp_path):
    """Fetches ahead of small objects overlap (a slow one does not hold up the others), up to
    FETCH_THREADS at once."""
    from zephon.io.fetch_ahead import FETCH_THREADS

    objects = {f"small/{n:02d}.jsonl": b'{"text": "%d"}\n' % n for n in range(20)}
    s3.bucket("many", objects)
    dataset = Dataset.from_path("d", "s3://many/small/").bound(fast_options(tmp_path / "c"))
    files = dataset.files()
    held = Fault(r"^GET /many/small/\d+\.jsonl$", hold_after=0, times=None)
    proxy.faults.append(held)

    def in_flight() -> int:
        return proxy.count(r"^GET /many/small/\d+\.jsonl$")

    dataset.fetch_ahead(list(files))
    deadline = time.monotonic() + 60
    while in_flight() < FETCH_THREADS:
        assert time.monotonic() < deadline, f"{in_flight()} downloads in flight"
        time.sleep(0.01)
    time.sleep(0.2)
    assert in_flight() == FETCH_THREADS  # all held, and none started beyond the bound
    held.release.set()
    dataset.wait_fetches()
    assert dataset.cache.stats.downloads == len(files) == dataset.fetches.fetched
    for data_file in files:
        with dataset.local_file(data_file) as local:
            assert Path(local).read_bytes() == objects[data_file.path]


def test_documented_usage_is_silent(s3, tmp_path, tmp_path_factory, caplog):
    """A LitData folder (its index.json skipped as the index of its chunks, the documented
    usage) listed and read with progress on: no warning, no line a download; the skip is
    still listed."""
    import logging

    from tests.core import litdata_sets

    local = litdata_sets.build(tmp_path_factory.getbasetemp() / "litdata-sets", "batch")
    upload(s3, "quiet", local, "train/")
    dataset = Dataset.from_path("d", "s3://quiet/train/").bound(
        fast_options(tmp_path / "cache", show_progress=True))
    with caplog.at_level(logging.INFO, logger="zephon"):
        for data_file in dataset.files():
            with dataset.local_file(data_file):
                pass
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert [s for s in dataset.skipped_files() if "index.json (index of the" in s]


def test_litdata_from_each_store_gives_the_local_tokens(store, tokenizer_dir, tmp_path,
                                                        tmp_path_factory, request):
    """A LitData dataset (index.json and chunks written by litdata.optimize) in each store:
    the index is read once while listing, the chunks through the cache, and the tokens are
    the local folder's."""
    from tests.core import litdata_sets
    from tests.kit.mds import pipeline_over, token_rows

    local = litdata_sets.build(tmp_path_factory.getbasetemp() / "litdata-sets", "batch")
    scheme, server = store
    bucket = f"lit-{scheme}-{request.node.callspec.id}".replace("_", "-")
    upload(server, bucket, local, "train/")
    remote = pipeline_over(f"{scheme}://{bucket}/train/", tokenizer_dir,
                           io_options=fast_options(tmp_path / "cache"))
    assert token_rows(remote) == token_rows(pipeline_over(local, tokenizer_dir))
    assert {f.fmt for f in remote.loader().source.datasets[0].files()} == {"litdata"}
