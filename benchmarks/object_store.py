"""Reading from an object store against the same files on local disk, side by side.

Builds (once, under ``--root``) ``--shards`` Parquet files of pseudo-English documents,
starts moto's S3 server in a process of its own on 127.0.0.1 and uploads them, then prints:

- ``clients``: MB/s downloading every object once with each S3 client Zephon could be built
  on (``obstore``, ``pyarrow.fs.S3FileSystem``, ``boto3``), alternating ``--repeats`` times,
  and each one's install size: the figures behind the choice of obstore;
- ``pipeline``: ``tokenize -> pack_flat(2049) -> batch(8)`` over the local files, over
  ``s3://`` with a cold cache and with a warm cache: time to the first batch, tokens/s
  (medians of ``--repeats`` alternating runs), and whether the three gave identical tokens;
- ``shared cache``: ``--procs`` processes reading the whole dataset at once through one cache
  root: bytes downloaded by all of them against the bytes they read;
- ``small objects``: ``--small`` one-line JSON Lines objects read by a pipeline (4 lanes, batches
  of 8, a cold cache), seconds and milliseconds an object, the cache's bookkeeping files, and a
  digest of the rows in order. ``--compare-with DIR`` runs the same in a process whose
  ``PYTHONPATH`` is ``DIR`` (another checkout's ``core``, e.g. the main branch's), side by side
  on the same server.

moto is a Python server, so its own speed (one core, tens of MB/s) caps every S3 figure here;
the client and cache overheads are what the figures compare, not S3's bandwidth.

Usage: ``python -m benchmarks.object_store [--shards 16] [--docs-per-shard 400] [--small 2000]
[--compare-with /path/to/other/core] [--sections clients,pipeline,shared,small]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEY_ID, SECRET, REGION = "bench-key", "bench-secret", "us-east-1"
SERVER = """
import json, logging, sys
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import ThreadedMotoServer

class Counted:
    \"\"\"Counts the requests moto answers (not the uploads) by kind, and the bytes of GETs.\"\"\"
    def __init__(self, app):
        self.app, self.counts = app, {}
    def __call__(self, environ, start_response):
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        if method == "GET" and ("list-type" in query or environ["PATH_INFO"].count("/") < 2):
            kind = "list"
        elif method == "GET":
            kind = "range" if "HTTP_RANGE" in environ else "get"
        else:
            kind = method.lower()
        body = self.app(environ, start_response)
        n = 0
        for part in body:
            n += len(part)
            yield part
        if kind != "put":
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.counts[kind + "_bytes"] = self.counts.get(kind + "_bytes", 0) + n

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
server._server.app = counted = Counted(server._server.app)
print(server.get_host_and_port()[1], flush=True)
for line in sys.stdin:  # "stats": print the counts so far and start again
    print(json.dumps(counted.counts), flush=True)
    counted.counts = {}
"""


def build_corpus(root: Path, shards: int, per_shard: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.demo.assets import make_documents

    folder = root / f"corpus-{shards}x{per_shard}"
    if (folder / ".done").exists():
        return folder / "data"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        texts = make_documents(per_shard, seed=i, min_words=200, max_words=2000)
        pq.write_table(pa.table({"text": texts}), folder / "data" / f"part-{i:03d}.parquet",
                       row_group_size=64)
    (folder / ".done").write_text("")
    return folder / "data"


def start_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own; write a line to its stdin to read back the
    requests it answered since the last line (:func:`request_counts`)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def request_counts(server: subprocess.Popen) -> dict[str, int]:
    """The requests the server answered since the last call, by kind (``list``, ``range``,
    ``get``, ``head``) and their body bytes (``range_bytes``...); uploads are not counted."""
    server.stdin.write("stats\n")
    server.stdin.flush()
    return json.loads(server.stdout.readline())


def client_rates(endpoint: str, keys: list[str], total: int) -> dict[str, float]:
    """Seconds to download every object once, per client."""
    import boto3
    import obstore
    from obstore.store import S3Store
    from pyarrow import fs

    store = S3Store("bench", config={"endpoint": endpoint, "access_key_id": KEY_ID,
                                     "secret_access_key": SECRET, "region": REGION,
                                     "virtual_hosted_style_request": False},
                    client_options={"allow_http": True})
    arrow = fs.S3FileSystem(access_key=KEY_ID, secret_key=SECRET, region=REGION,
                            endpoint_override=endpoint, scheme="http")
    boto = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)

    def with_obstore() -> int:
        return sum(len(c) for k in keys
                   for c in obstore.get(store, k).stream(min_chunk_size=64 << 10))

    def with_arrow() -> int:
        n = 0
        for k in keys:
            with arrow.open_input_stream(f"bench/{k}") as f:
                while chunk := f.read(1 << 20):
                    n += len(chunk)
        return n

    def with_boto() -> int:
        return sum(len(c) for k in keys
                   for c in boto.get_object(Bucket="bench", Key=k)["Body"].iter_chunks(1 << 20))

    out = {}
    for name, fn in (("obstore", with_obstore), ("pyarrow.fs", with_arrow),
                     ("boto3", with_boto)):
        started = time.perf_counter()
        assert fn() == total
        out[name] = time.perf_counter() - started
    return out


def pipeline_run(path: str, tokenizer: str, cache: str | None) -> dict:
    """First-batch seconds, tokens/s and a digest of every batch, in a fresh process."""
    code = f"""
import hashlib, json, time
started = time.perf_counter()
from zephon import Pipeline
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.work import MixtureSpec, StaticMixtureWorkSource
source = StaticMixtureWorkSource([Dataset.from_path("d", {path!r})], MixtureSpec({{"d": 1.0}}),
                                 seed=1, repeat=False)
options = {{"lanes": 4}}
if {cache!r}:
    options["io_options"] = StoreOptions(cache=CacheOptions(enabled=True, root={cache!r}),
                                         show_progress=False)
pipeline = (Pipeline(source).tokenize(tokenizer_id={tokenizer!r}).pack_flat(2049, "wrap")
            .batch(8).options(**options))
digest, tokens, first = hashlib.sha256(), 0, None
for batch in pipeline:
    if first is None:
        first = time.perf_counter() - started
    for record in batch.records:
        ids = record.payload["input_ids"]
        tokens += len(ids)
        digest.update(ids.tobytes())
    time.sleep(0.001)  # the trainer's step, holding nothing
print(json.dumps({{"first": first, "seconds": time.perf_counter() - started,
                   "tokens": tokens, "digest": digest.hexdigest()[:16]}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=os.environ)
    return json.loads(result.stdout.strip().splitlines()[-1])


def shared_cache(path: str, procs: int, cache: str) -> tuple[int, int]:
    """(bytes downloaded by all processes, bytes they read) with one cache root."""
    code = f"""
import json
from zephon.io import CacheOptions, Dataset, StoreOptions
d = Dataset.from_path("d", {path!r}).bound(StoreOptions(cache=CacheOptions(
    enabled=True, root={cache!r}), show_progress=False))
read = 0
for f in d.files():
    with d.local_file(f):
        read += f.size
print(json.dumps({{"downloaded": d.cache.stats.downloaded_bytes, "read": read}}))
"""
    running = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                text=True, env=os.environ) for _ in range(procs)]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in running]
    return sum(o["downloaded"] for o in outs), sum(o["read"] for o in outs)


def small_run(path: str, cache: str, pythonpath: str | None) -> dict:
    """Seconds to read every row of ``path`` through a pipeline with a cold cache at
    ``cache``, the rows, a digest of them in order and the cache's files other than shards, in
    a fresh process (``pythonpath``: the code to run, else this one's)."""
    code = f"""
import hashlib, json, os, time
from zephon import Pipeline
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.work import MixtureSpec, StaticMixtureWorkSource
started = time.perf_counter()
source = StaticMixtureWorkSource([Dataset.from_path("d", {path!r})], MixtureSpec({{"d": 1.0}}),
                                 seed=1, repeat=False)
options = StoreOptions(cache=CacheOptions(enabled=True, root={cache!r}), show_progress=False)
pipeline = Pipeline(source).batch(8, drop_last=False).options(lanes=4, io_options=options)
digest, rows = hashlib.sha256(), 0
for batch in pipeline:
    for record in batch.records:
        digest.update(record.payload["text"].encode())
        rows += 1
seconds = time.perf_counter() - started
files = sum(len(names) for folder, _, names in os.walk({cache!r})
            if not folder.endswith("shards"))
print(json.dumps({{"seconds": seconds, "rows": rows, "digest": digest.hexdigest()[:16],
                   "bookkeeping": files}}))
"""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def small_objects(endpoint: str, count: int, root: Path, compare_with: str | None) -> None:
    """The ``small objects`` section (see the module docstring)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                      aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    s3.create_bucket(Bucket="small")
    for i in range(count):
        s3.put_object(Bucket="small", Key=f"lines/{i:05d}.jsonl",
                      Body=json.dumps({"text": f"document {i}"}).encode() + b"\n")
    started = time.perf_counter()
    keys = [f"lines/{i:05d}.jsonl" for i in range(min(count, 200))]
    for key in keys:
        s3.get_object(Bucket="small", Key=key)["Body"].read()
    per_get = (time.perf_counter() - started) / len(keys)
    runs = {"this checkout": None}
    if compare_with:
        runs[compare_with] = compare_with
    results = {name: small_run("s3://small/lines/", str(root / f"small-{time.time_ns()}"),
                               code) for name, code in runs.items()}
    print(f"\nsmall objects ({count} one-line JSON Lines objects, 4 lanes, cold cache; one "
          f"boto3 GET: {per_get * 1e3:.1f} ms):")
    for name, result in results.items():
        print(f"  {name:30s} {result['seconds']:7.2f} s  {result['seconds'] / count * 1e3:6.1f} "
              f"ms an object  {result['rows']} rows  {result['bookkeeping']:6d} bookkeeping "
              f"files  rows digest {result['digest']}")
    if compare_with:
        mine, other = results["this checkout"], results[compare_with]
        print(f"  {other['seconds'] / mine['seconds']:.1f}x faster than {compare_with}; the "
              f"same rows in the same order: {mine['digest'] == other['digest']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "zephon-bench-s3"))
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--docs-per-shard", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--small", type=int, default=2000,
                        help="one-line objects of the small objects section")
    parser.add_argument("--compare-with", default=None, metavar="DIR",
                        help="also run the small objects section with PYTHONPATH=DIR")
    parser.add_argument("--sections", default="clients,pipeline,shared,small",
                        help="comma-separated sections to run")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    import boto3

    from zephon.demo.assets import build_demo_assets

    root = Path(args.root)
    data = build_corpus(root, args.shards, args.docs_per_shard)
    tokenizer = build_demo_assets(root / "assets", n_docs=400, n_files=1)["tokenizer"]
    files = sorted(data.glob("*.parquet"))
    total = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} Parquet files, {total / 1e6:.1f} MB")
    server, endpoint = start_server()
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                          aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
        s3.create_bucket(Bucket="bench")
        for f in files:
            s3.upload_file(str(f), "bench", f"data/{f.name}")
        os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID=KEY_ID,
                          AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION)
        keys = [f"data/{f.name}" for f in files]
        if "clients" in sections:
            seconds: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                for name, spent in client_rates(endpoint, keys, total).items():
                    seconds.setdefault(name, []).append(spent)
            print("\nclients (download every object once; MB/s, median):")
            sizes = {"obstore": "obstore", "pyarrow.fs": None, "boto3": "botocore"}
            for name, spent in seconds.items():
                print(f"  {name:11s} {total / 1e6 / statistics.median(spent):7.1f} MB/s   "
                      f"install {_install_mb(sizes[name])}")

        if "pipeline" in sections:
            runs: dict[str, list[dict]] = {"local": [], "s3 cold": [], "s3 warm": []}
            for i in range(args.repeats):
                cache = str(root / f"cache-{time.time_ns()}-{i}")
                path = "s3://bench/data/*.parquet"
                runs["local"].append(pipeline_run(str(data), tokenizer, None))
                runs["s3 cold"].append(pipeline_run(path, tokenizer, cache))
                runs["s3 warm"].append(pipeline_run(path, tokenizer, cache))
            print("\npipeline (tokenize, pack 2049, batch 8; medians):")
            base = statistics.median(r["tokens"] / r["seconds"] for r in runs["local"])
            for name, results in runs.items():
                rate = statistics.median(r["tokens"] / r["seconds"] for r in results)
                first = statistics.median(r["first"] for r in results)
                print(f"  {name:8s} first batch {first:6.2f} s   {rate / 1e6:6.2f} M tokens/s "
                      f"({rate / base:5.2f}x local)")
            digests = {r["digest"] for results in runs.values() for r in results}
            print(f"  identical tokens in every run: {len(digests) == 1}")

        if "shared" in sections:
            downloaded, read = shared_cache("s3://bench/data/*.parquet", args.procs,
                                            str(root / f"shared-{time.time_ns()}"))
            print(f"\nshared cache, {args.procs} processes: downloaded {downloaded / 1e6:.1f} "
                  f"MB, read {read / 1e6:.1f} MB ({read / max(downloaded, 1):.2f}x; dataset "
                  f"{total / 1e6:.1f} MB)")

        if "small" in sections:
            small_objects(endpoint, args.small, root, args.compare_with)
    finally:
        server.stdin.close()
        server.terminate()
        server.wait()


def _install_mb(package: str | None) -> str:
    if package is None:
        return "0 MB (in pyarrow)"
    import importlib.util

    spec = importlib.util.find_spec(package)
    folder = Path(spec.origin).parent
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return f"{size / 1e6:.0f} MB ({package})"


if __name__ == "__main__":
    main()
