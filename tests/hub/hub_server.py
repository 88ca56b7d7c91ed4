"""A small Hugging Face Hub protocol server for tests, on 127.0.0.1.

It answers what huggingface_hub's ``HfApi.dataset_info``/``model_info``, ``list_repo_tree``
(paginated), ``list_repo_refs`` and file downloads ask for, for dataset and model
repositories, the way the Hub does: revisions resolve to commits (branches, tags,
``refs/convert/parquet``, commit hashes), LFS files redirect to a content URL and carry their
SHA-256 as ETag, ``Range`` requests are answered with 206, missing and private repositories
answer 401 ``RepoNotFound`` without an authorized token, and gated ones serve metadata to
anyone but files only to authorized tokens (401 or 403 ``GatedRepo``).
Tests inject failures (status, headers, count), throttle downloads, run hooks after chosen
requests, and read the request log.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

LFS_SUFFIXES = (".parquet", ".arrow", ".gz", ".zst", ".zip")
CONVERSION_REF = "refs/convert/parquet"


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def card_data(readme: bytes | None) -> dict | None:
    if readme is None:
        return None
    text = readme.decode()
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---", 4)
    return yaml.safe_load(text[4:end]) if end > 0 else None


@dataclass
class Repo:
    repo_id: str
    private: bool = False
    gated: bool = False
    tokens: set[str] = field(default_factory=set)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    conversion: str | None = None
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    status: int
    range: str | None
    time: float
    authorized: bool


@dataclass
class _Rule:
    pattern: re.Pattern[str]
    remaining: int
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    action: Callable[[], None] | None = None
    bytes_per_s: float = 0.0


class FakeHub:
    """The server; ``url`` is its endpoint. Mutators are safe to call while it serves."""

    def __init__(self, page_size: int = 1000):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.page_size = page_size
        self.ranges = True
        """False: answer Range requests with the whole file, as some servers do."""
        self._faults: list[_Rule] = []
        self._hooks: list[_Rule] = []
        self._throttles: list[_Rule] = []
        self._lock = threading.RLock()
        self._counter = 0
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- content ---------------------------------------------------------------------------
    def create(self, repo_id: str, files: dict[str, bytes], *, private: bool = False,
               gated: bool = False, tokens: tuple[str, ...] = (), model: bool = False) -> str:
        """A dataset (or, with ``model``, a model) repository whose ``main`` branch holds
        ``files``; returns the commit. A model repository is named ``models/<repo_id>`` in
        the other mutators."""
        key = f"models/{repo_id}" if model else repo_id
        with self._lock:
            self.repos[key] = Repo(repo_id, private, gated, set(tokens))
            return self.push(key, files)

    def push(self, repo_id: str, files: dict[str, bytes], branch: str = "main",
             delete: tuple[str, ...] = ()) -> str:
        """A new commit on ``branch`` (created from main if new) adding/replacing ``files``."""
        with self._lock:
            repo = self.repos[repo_id]
            base = repo.branches.get(branch) or repo.branches.get("main")
            content = dict(repo.commits[base]) if base else {}
            for path in delete:
                content.pop(path, None)
            content.update(files)
            sha = self._new_commit(repo, content)
            repo.branches[branch] = sha
            return sha

    def tag(self, repo_id: str, name: str, commit: str) -> None:
        with self._lock:
            self.repos[repo_id].tags[name] = commit

    def convert(self, repo_id: str, files: dict[str, bytes]) -> str:
        """Set the repository's Parquet conversion (``refs/convert/parquet``) to ``files``."""
        with self._lock:
            repo = self.repos[repo_id]
            repo.conversion = self._new_commit(repo, dict(files))
            return repo.conversion

    def _new_commit(self, repo: Repo, content: dict[str, bytes]) -> str:
        self._counter += 1
        sha = hashlib.sha1(f"{repo.repo_id}:{self._counter}".encode()).hexdigest()
        repo.commits[sha] = content
        return sha

    # -- behaviour -------------------------------------------------------------------------
    def fail(self, pattern: str, status: int, times: int = 1,
             headers: dict[str, str] | None = None) -> None:
        """Answer the next ``times`` requests whose path matches ``pattern`` with ``status``."""
        with self._lock:
            self._faults.append(_Rule(re.compile(pattern), times, status, headers or {}))

    def after(self, pattern: str, action: Callable[[], None], times: int = 1) -> None:
        """Run ``action`` after answering the next ``times`` requests matching ``pattern``."""
        with self._lock:
            self._hooks.append(_Rule(re.compile(pattern), times, action=action))

    def throttle(self, pattern: str, bytes_per_s: float) -> None:
        """Send the bodies of matching downloads at about ``bytes_per_s``."""
        with self._lock:
            self._throttles.append(_Rule(re.compile(pattern), 1 << 30, bytes_per_s=bytes_per_s))

    def count(self, pattern: str = "", method: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if re.search(pattern, r.path)
                       and (method is None or r.method == method))

    def log(self, pattern: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if re.search(pattern, r.path)]

    def _take(self, rules: list[_Rule], path: str) -> _Rule | None:
        with self._lock:
            for rule in rules:
                if rule.remaining > 0 and rule.pattern.search(path):
                    rule.remaining -= 1
                    return rule
        return None

    # -- routing ---------------------------------------------------------------------------
    def resolve_revision(self, repo: Repo, revision: str) -> str | None:
        if revision in repo.branches:
            return repo.branches[revision]
        if revision in repo.tags:
            return repo.tags[revision]
        if revision == CONVERSION_REF:
            return repo.conversion
        return revision if revision in repo.commits else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    # -- plumbing --------------------------------------------------------------------------
    def _handle(self, head: bool) -> None:
        hub = self.server_hub
        split = urlsplit(self.path)
        self._status = 0
        self._recorded = False
        self._request_path = split.path
        try:
            fault = hub._take(hub._faults, split.path)
            if fault is not None:
                self._send_json(fault.status, {"error": f"injected {fault.status}"},
                                fault.headers, head)
            else:
                self._route(split.path, parse_qs(split.query), head)
        finally:
            self._record()
            hook = hub._take(hub._hooks, split.path)
            if hook is not None and hook.action is not None:
                hook.action()

    def _record(self) -> None:
        """Log the request once, before its answer leaves: a client that reads the log right
        after its response must find the request there."""
        if self._recorded:
            return
        self._recorded = True
        hub = self.server_hub
        with hub._lock:
            hub.requests.append(Request(self.command, self._request_path, self._status,
                                        self.headers.get("Range"), time.monotonic(),
                                        self._token() is not None))

    def _token(self) -> str | None:
        value = self.headers.get("Authorization", "")
        return value[len("Bearer "):] if value.startswith("Bearer ") else None

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool,
              throttle: float = 0.0) -> None:
        self._status = status
        self._record()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if throttle <= 0:
            self.wfile.write(body)
            return
        step = max(1024, int(throttle / 20))
        for start in range(0, len(body), step):
            self.wfile.write(body[start:start + step])
            self.wfile.flush()
            time.sleep(step / throttle)

    def _send_json(self, status: int, payload: object, headers: dict[str, str] | None = None,
                   head: bool = False) -> None:
        self._send(status, json.dumps(payload).encode(),
                   {"Content-Type": "application/json", **(headers or {})}, head)

    def _error(self, status: int, code: str | None, message: str, head: bool) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send_json(status, {"error": message}, headers, head)

    # -- routes ----------------------------------------------------------------------------
    def _route(self, path: str, query: dict[str, list[str]], head: bool) -> None:
        hub = self.server_hub
        if path.startswith("/cdn/"):
            return self._serve_cdn(path, head)
        m = re.match(r"^/api/(datasets|models)/([^/]+)/([^/]+)"
                     r"(?:/(revision|tree|refs)(?:/(.*))?)?$", path)
        r = re.match(r"^/(?:(datasets)/)?([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$", path)
        match = m or r
        if match is None:
            return self._error(404, None, "unknown route", head)
        repo_id = f"{match.group(2)}/{match.group(3)}"
        model = match.group(1) in ("models", None)
        repo = hub.repos.get(f"models/{repo_id}" if model else repo_id)
        token = self._token()
        if repo is None or (repo.private and token not in repo.tokens):
            return self._error(401, "RepoNotFound", "Repository not found", head)
        if m is not None:
            return self._api(repo, m.group(4), m.group(5) or "", query, head)
        revision = unquote(r.group(4))
        commit = hub.resolve_revision(repo, revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", "Invalid rev id", head)
        if repo.gated and token not in repo.tokens:
            status = 401 if token is None else 403
            kind = "model" if model else "dataset"
            return self._error(status, "GatedRepo",
                               f"Access to {kind} {repo_id} is restricted.", head)
        file_path = unquote(r.group(5))
        content = repo.commits[commit].get(file_path)
        if content is None:
            return self._error(404, "EntryNotFound", "Entry not found", head)
        headers = {"X-Repo-Commit": commit}
        if file_path.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(content).hexdigest()
            headers.update({"Location": f"/cdn/{quote(repo_id, safe='')}/{commit}/{sha}/"
                            f"{quote(file_path, safe='')}", "ETag": f'"{sha}"',
                            "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(content))})
            return self._send(302, b"", headers, head)
        headers["ETag"] = f'"{git_blob_id(content)}"'
        return self._content(content, headers, head)

    def _serve_cdn(self, path: str, head: bool) -> None:
        hub = self.server_hub
        _, _, repo_id, commit, sha, file_path = path.split("/", 5)
        content = hub.repos[unquote(repo_id)].commits[commit][unquote(file_path)]
        return self._content(content, {"ETag": f'"{sha}"'}, head)

    def _content(self, content: bytes, headers: dict[str, str], head: bool) -> None:
        hub = self.server_hub
        headers = {**headers, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        wanted = self.headers.get("Range")
        rule = hub._take(hub._throttles, self._request_path)
        if rule is not None:
            rule.remaining += 1
        throttle = rule.bytes_per_s if rule is not None else 0.0
        if wanted and hub.ranges:
            m = re.match(r"^bytes=(\d*)-(\d*)$", wanted)
            size = len(content)
            if m is None:
                return self._error(416, None, "bad range", head)
            first, last = m.groups()
            if first == "":
                start, stop = max(0, size - int(last)), size
            else:
                start = int(first)
                stop = min(size, int(last) + 1) if last else size
            if start >= size:
                return self._error(416, None, "range not satisfiable", head)
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
            return self._send(206, content[start:stop], headers, head, throttle)
        return self._send(200, content, headers, head, throttle)

    def _api(self, repo: Repo, kind: str | None, rest: str, query: dict[str, list[str]],
             head: bool) -> None:
        hub = self.server_hub
        if kind == "refs":
            def refs(items: dict[str, str], prefix: str) -> list[dict[str, str]]:
                return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": c}
                        for n, c in sorted(items.items())]
            converts = ([{"name": "parquet", "ref": CONVERSION_REF,
                          "targetCommit": repo.conversion}] if repo.conversion else [])
            return self._send_json(200, {"branches": refs(repo.branches, "refs/heads/"),
                                         "tags": refs(repo.tags, "refs/tags/"),
                                         "converts": converts}, head=head)
        raw_revision, _, raw_sub = rest.partition("/") if kind == "tree" else (rest, "", "")
        revision, sub = unquote(raw_revision), unquote(raw_sub)
        commit = hub.resolve_revision(repo, revision or "main")
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        files = repo.commits[commit]
        if kind == "tree":
            return self._tree(repo, revision, commit, files, sub, query, head)
        card = card_data(files.get("README.md"))
        info = {"_id": repo.repo_id, "id": repo.repo_id, "author": repo.repo_id.split("/")[0],
                "sha": commit, "private": repo.private,
                "gated": "auto" if repo.gated else False, "disabled": False,
                "lastModified": "2026-01-01T00:00:00.000Z", "tags": [],
                "siblings": [{"rfilename": p} for p in sorted(files)]}
        if card is not None:
            info["cardData"] = card
        return self._send_json(200, info, head=head)

    def _tree(self, repo: Repo, revision: str, commit: str, files: dict[str, bytes], sub: str,
              query: dict[str, list[str]], head: bool) -> None:
        hub = self.server_hub
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{sub.rstrip('/')}/" if sub else ""
        entries: dict[str, dict] = {}
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix):]
            parts = rel.split("/")
            for depth in range(1, len(parts)):
                folder = prefix + "/".join(parts[:depth])
                if recursive or depth == 1:
                    entries.setdefault(folder, {"type": "directory", "path": folder,
                                                "oid": hashlib.sha1(folder.encode()).hexdigest()})
            if len(parts) > 1 and not recursive:
                continue
            content = files[path]
            entry = {"type": "file", "path": path, "size": len(content),
                     "oid": git_blob_id(content)}
            if path.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(content).hexdigest(),
                                "size": len(content), "pointerSize": 134}
                entry["oid"] = git_blob_id(b"version lfs %d" % len(content))
            entries[path] = entry
        ordered = [entries[k] for k in sorted(entries)]
        cursor = int(query.get("cursor", ["0"])[0])
        page = ordered[cursor:cursor + hub.page_size]
        headers = {}
        if cursor + hub.page_size < len(ordered):
            link = (f"{hub.url}/api/datasets/{repo.repo_id}/tree/{quote(revision, safe='')}"
                    f"{'/' + quote(sub) if sub else ''}?recursive={recursive!s}"
                    f"&cursor={cursor + hub.page_size}")
            headers["Link"] = f'<{link}>; rel="next"'
        return self._send_json(200, page, headers, head)
