"""The shard cache on a shared machine: roots of another user or open to everyone are refused,
links inside the root are never followed, a full disk and a read-only cache give errors that
name the path, and eviction skips what is not a shard."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pwd
import stat
from pathlib import Path

import pytest

from tests.hub.disks import fill, read_only_view, small_disk
from tests.hub.hubdata import docs, fast_options, jsonl_bytes, sharded
from tests.kit.hub import load
from zephon import cli
from zephon.errors import ConfigError, DataError
from zephon.io import CacheOptions
from zephon.io.cache.locks import FileLock
from zephon.io.cache.shard_cache import (
    CachedFile,
    ShardCache,
    cache_entries,
    download_lock,
    prune_cache,
    verify_cache,
)
from zephon.io.store_options import default_cache_root

LIMIT_NAMES = "[cache] limit_bytes in a recipe, CacheOptions.limit_bytes in Python"


def item(name: str, content: bytes) -> CachedFile:
    return CachedFile(name, len(content), "sha256:" + hashlib.sha256(content).hexdigest(),
                      f"hf://org/data@abc/{name}")


def put(cache: ShardCache, entry: CachedFile, content: bytes) -> None:
    with cache.open(entry, lambda out: out.write(content)) as path:
        assert Path(path).read_bytes() == content


def victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    """A file outside the cache that a planted link points at."""
    path = tmp_path / name
    path.write_bytes(b"precious " + name.encode())
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


# -- roots of others ---------------------------------------------------------------------------
def test_a_root_made_first_by_another_user_is_refused_and_its_links_stay_untouched(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user (chown) needs root")
    content = b"shard bytes" * 100
    entry = item("train.parquet", content)
    root = tmp_path / "zephon-cache"
    targets = {}
    for sub in ("shards", "partial", "state", "locks"):
        (root / sub).mkdir(parents=True)
    lock = download_lock(Path(), entry.key)
    for link in (f"partial/{entry.key}", f"partial/{entry.key}.reserve", str(lock),
                 f"state/{entry.key}.pin", "cache.lock"):
        targets[link] = victim(tmp_path, link.replace("/", "_"))
        (root / link).symlink_to(targets[link])
    for folder in (root, *(root / sub for sub in ("shards", "partial", "state", "locks"))):
        os.chown(folder, nobody(), nobody())
        os.chmod(folder, 0o777)
    with pytest.raises(ConfigError) as info:
        ShardCache(CacheOptions(enabled=True, root=str(root)))
    message = str(info.value)
    assert f"shard cache root {root} belongs to" in message and "not to you" in message
    assert "of your own" in message and str(default_cache_root()) in message
    with pytest.raises(ConfigError, match="belongs to"):
        prune_cache(root, 0)
    for link, target in targets.items():
        assert target.read_bytes() == b"precious " + link.replace("/", "_").encode(), link
        assert (root / link).is_symlink()


@pytest.mark.parametrize("sub, folder_mode, who", [
    ("", 0o777, "group and others"), ("", 0o775, "group"), ("state", 0o757, "others"),
    ("partial", 0o1777, "group and others")])
def test_a_root_or_folder_that_others_can_write_is_refused(tmp_path, sub, folder_mode, who):
    root = tmp_path / "c"
    ShardCache(CacheOptions(enabled=True, root=str(root)))
    os.chmod(root / sub, folder_mode)
    with pytest.raises(ConfigError) as info:
        ShardCache(CacheOptions(enabled=True, root=str(root)))
    assert f"{root / sub if sub else root} can be written by {who}" in str(info.value)
    assert f"chmod 700 {root / sub if sub else root}" in str(info.value)


def test_a_linked_subfolder_is_refused(tmp_path):
    root = tmp_path / "c"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.mkdir(mode=0o700)
    (root / "state").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=rf"{root / 'state'} is a symbolic link"):
        ShardCache(CacheOptions(enabled=True, root=str(root)))
    assert not any(elsewhere.iterdir())


def test_a_root_of_ones_own_may_be_a_link(tmp_path):
    disk = tmp_path / "scratch"
    disk.mkdir(mode=0o700)
    (tmp_path / "c").symlink_to(disk)
    cache = ShardCache(CacheOptions(enabled=True, root=str(tmp_path / "c")))
    put(cache, item("a", b"a" * 10), b"a" * 10)
    assert len(list((disk / "shards").iterdir())) == 1


def test_roots_and_files_are_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        cache = ShardCache(CacheOptions(enabled=True, root=str(tmp_path / "new" / "c")))
        put(cache, item("a", b"a" * 10), b"a" * 10)
    finally:
        os.umask(old)
    root = tmp_path / "new" / "c"
    for folder in (root, root / "shards", root / "partial", root / "state", root / "locks"):
        assert mode(folder) == 0o700, folder
    files = [*(root / "state").iterdir(), *(root / "locks").iterdir(), root / "cache.lock"]
    assert files and all(mode(p) == 0o600 for p in files), {p.name: oct(mode(p)) for p in files}


def test_the_default_root_is_per_user(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_root() == tmp_path / "xdg" / "zephon" / "shard-cache"
    cache = ShardCache(CacheOptions(enabled=True))
    assert cache.root == tmp_path / "xdg" / "zephon" / "shard-cache"
    assert mode(cache.root) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_root() == tmp_path / "home" / ".cache" / "zephon" / "shard-cache"


# -- links inside a private root ---------------------------------------------------------------
def test_links_planted_in_a_private_root_are_replaced_not_followed(tmp_path):
    root = tmp_path / "c"
    cache = ShardCache(CacheOptions(enabled=True, root=str(root), limit_bytes=10_000))
    content = os.urandom(3000)
    entry = item("train.parquet", content)
    planted = {f"partial/{entry.key}": victim(tmp_path, "partial"),
               f"partial/{entry.key}.reserve": victim(tmp_path, "reserve")}
    # a link in shards/ to a file with the right bytes is still not a shard
    good = tmp_path / "lookalike"
    good.write_bytes(content)
    planted[f"shards/{entry.key}"] = good
    for link, target in planted.items():
        (root / link).symlink_to(target)
    with cache.open(entry, lambda out: out.write(content)) as path:
        assert not os.path.islink(path) and Path(path).read_bytes() == content
    assert cache.stats.downloads == 1 and cache.stats.discarded == 1
    for name in ("partial", "reserve"):
        assert (tmp_path / name).read_bytes() == b"precious " + name.encode()
    assert good.read_bytes() == content
    assert not (root / "partial" / entry.key).exists()
    record = root / "state" / f"{entry.key}.pin"
    assert not record.is_symlink() and json.loads(record.read_text())["size"] == 3000
    put(cache, entry, content)
    assert cache.stats.hits == 1


@pytest.mark.parametrize("kind", ["lock", "pin"])
def test_a_lock_file_that_is_a_link_is_refused(tmp_path, kind):
    root = tmp_path / "c"
    cache = ShardCache(CacheOptions(enabled=True, root=str(root)))
    entry = item("x.parquet", b"x" * 100)
    target = victim(tmp_path)
    link = cache._download_lock(entry.key) if kind == "lock" else cache._pin(entry.key)
    link.symlink_to(target)
    os.utime(target, (1, 1))
    with pytest.raises(ConfigError) as info, cache.open(entry, lambda out: out.write(b"x" * 100)):
        pass
    assert f"lock file {link} is a symbolic link" in str(info.value)
    assert target.read_bytes() == b"precious victim.txt" and target.stat().st_mtime == 1
    with pytest.raises(ConfigError, match="symbolic link"):
        FileLock(link).acquire()


# -- a full disk -------------------------------------------------------------------------------
def test_a_shard_larger_than_the_free_disk_is_refused_naming_the_root(tmp_path, hub):
    rows = [{"text": os.urandom(3000).hex()} for _ in range(300)]  # about 1.8 MB
    hub.create("org/big", {"train.jsonl": jsonl_bytes(rows)})
    with small_disk(tmp_path) as disk:
        dataset = load("hf://org/big/train", fast_options(disk / "c"))
        size = dataset.files()[0].size
        with pytest.raises(DataError) as info, dataset.local_file(dataset.files()[0]):
            pass
        message = str(info.value)
        assert (f"shard cache root {disk / 'c'}: the disk is full for hf://org/big@"
                f"{dataset.commit}/train.jsonl: it needs {size} bytes") in message
        assert "limit_bytes=1073741824 is more than the disk holds" in message
        assert LIMIT_NAMES in message and "[cache] root in a recipe" in message
        assert not any((disk / "c" / "partial").iterdir())
        assert not [r for r in hub.log("/resolve/|/cdn/") if not r.range]  # no download


def test_a_full_disk_is_refused_before_downloading(tmp_path):
    with small_disk(tmp_path) as disk:
        cache = ShardCache(CacheOptions(enabled=True, root=str(disk / "c")))
        fill(disk)
        entry = item("a.parquet", b"a" * 100)
        fetched = []
        with pytest.raises(DataError) as info, cache.open(entry, fetched.append):
            pass
        message = str(info.value)
        assert f"shard cache root {disk / 'c'}: the disk is full for {entry.display}" in message
        assert f"No limit_bytes is set: set one below what the disk holds ({LIMIT_NAMES})" \
            in message
        assert not fetched and not any((disk / "c" / "partial").iterdir())


def test_a_full_disk_fails_the_listing_cache_with_our_error(tmp_path, hub):
    hub.create("org/small", sharded(docs(20, seed=61), 1, "train.parquet"))
    with small_disk(tmp_path) as disk:
        dataset = load("hf://org/small/train", fast_options(disk / "c"))
        fill(disk)
        with pytest.raises(DataError) as info:
            dataset.files()
        message = str(info.value)
        assert f"Hub listing cache file {disk / 'c' / 'listings'}/" in message
        assert "the disk is full" in message and "CacheOptions.root" in message
        assert not list((disk / "c" / "listings").glob("*.tmp"))


# -- what is not a shard -----------------------------------------------------------------------
def test_eviction_skips_folders_and_links_in_shards(tmp_path, caplog):
    root = tmp_path / "c"
    cache = ShardCache(CacheOptions(enabled=True, root=str(root), limit_bytes=2500))
    (root / "shards" / "a-folder").mkdir()
    (root / "shards" / "a-folder" / "inside").write_bytes(b"kept")
    target = victim(tmp_path)
    (root / "shards" / "a-link").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="zephon.io.cache.shard_cache"):
        for n in range(5):
            put(cache, item(f"f{n}", bytes([n]) * 1000), bytes([n]) * 1000)
    assert cache.stats.evictions == 3
    assert (root / "shards" / "a-folder" / "inside").read_bytes() == b"kept"
    assert (root / "shards" / "a-link").is_symlink() and target.exists()
    skipped = [r.getMessage() for r in caplog.records if "not a regular file" in r.getMessage()]
    assert len(skipped) == 2 and any("a-folder" in m for m in skipped)
    assert len(cache_entries(root)) == 2
    evicted, left = prune_cache(root, 0)
    assert len(evicted) == 2 and left == 0 and (root / "shards" / "a-folder").is_dir()


# -- a read-only cache -------------------------------------------------------------------------
def _filled(tmp_path: Path) -> tuple[Path, list[CachedFile]]:
    root = tmp_path / "c"
    cache = ShardCache(CacheOptions(enabled=True, root=str(root)))
    entries = []
    for n in range(3):
        body = bytes([n]) * 2000
        entries.append(item(f"part-{n}.parquet", body))
        put(cache, entries[-1], body)
    return root, entries


def test_ls_and_verify_work_on_a_read_only_mount(tmp_path, capsys):
    root, entries = _filled(tmp_path)
    shard = root / "shards" / entries[1].key
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])  # same size, other bytes
    writable = ShardCache(CacheOptions(enabled=True, root=str(root)))
    with read_only_view(root, tmp_path / "ro") as ro, \
            writable.open(entries[0], None):  # held open through the writable path
        assert cli.main(["cache", "ls", "--root", str(ro)]) == 0
        out = capsys.readouterr().out
        assert "3 shard(s), 6,000 bytes" in out and "part-2.parquet" in out
        assert [line for line in out.splitlines() if "in use" in line] == [
            line for line in out.splitlines() if "part-0.parquet" in line]
        assert cli.main(["cache", "verify", "--root", str(ro)]) == 1
        err = capsys.readouterr().err
        assert "part-1.parquet: its bytes do not match" in err and "not removed" in err
        assert "Read-only file system" in err
        assert shard.exists()
        with pytest.raises(ConfigError, match=rf"{ro}.* cannot be written \(Read-only file "):
            ShardCache(CacheOptions(enabled=True, root=str(ro)))
        assert not list((root / "state").glob("*.tmp"))


def test_ls_and_verify_print_names_escaped_one_line_each(tmp_path, capsys):
    """A cached name is what a remote listing said (an object key may hold any character):
    ``cache ls`` and ``cache verify`` print it escaped, so it cannot break lines or send
    terminal escapes."""
    root = tmp_path / "c"
    cache = ShardCache(CacheOptions(enabled=True, root=str(root)))
    body = b"x" * 100
    odd = CachedFile("odd.jsonl", len(body), "sha256:" + hashlib.sha256(body).hexdigest(),
                     "s3://b/line\nbreak\x1b[31mred\\.jsonl")
    put(cache, odd, body)
    shard = root / "shards" / odd.key
    shard.write_bytes(b"y" + body[1:])
    assert cli.main(["cache", "ls", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "s3://b/line\\nbreak\\x1b[31mred\\\\.jsonl" in out
    assert "\x1b" not in out and len(out.splitlines()) == 2
    assert cli.main(["cache", "verify", "--root", str(root)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("s3://b/line\\nbreak\\x1b[31mred\\\\.jsonl: its bytes do not "
                                   "match") and "\x1b" not in captured.err
    assert len(captured.err.splitlines()) == 1


def test_ls_and_verify_write_nothing(tmp_path, monkeypatch, capsys):
    """Without mounts: every call that could write fails as on a read-only file system."""
    root, _ = _filled(tmp_path)
    real_open = os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def read_only_open(path, flags, *args, **kwargs):
        if flags & writes:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "open", read_only_open)
    for name in ("mkdir", "unlink", "replace", "rename", "utime", "rmdir"):
        monkeypatch.setattr(os, name, refuse)
    assert cli.main(["cache", "ls", "--root", str(root)]) == 0
    assert "3 shard(s), 6,000 bytes" in capsys.readouterr().out
    assert cli.main(["cache", "verify", "--root", str(root)]) == 0
    assert "verified 3 shard(s), 0 bad" in capsys.readouterr().out
    assert [problem for _, problem in verify_cache(root)] == [None] * 3
