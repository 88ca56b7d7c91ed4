"""Disks for the cache tests: small file systems that fill up, and read-only views, mounted
for the test (as root; skipped where mounting is not allowed)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(target: Path, *args: str) -> Iterator[Path]:
    """``mount ARGS TARGET`` for the block (unmounted in the end); skip where not allowed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root and mount(8), which this environment does not give")
    target.mkdir(exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount is not allowed here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=True)


@contextlib.contextmanager
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A private 1 MiB tmpfs."""
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs") as disk:
        yield disk


@contextlib.contextmanager
def read_only_view(source: Path, target: Path) -> Iterator[Path]:
    """``source`` seen read-only at ``target`` (a read-only bind mount: root ignores modes)."""
    with mounted(target, "--bind", str(source)):
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(target)],
                                 capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"a read-only bind mount is not allowed here: {remount.stderr.strip()}")
        yield target


def fill(disk: Path) -> None:
    """Write until ``disk`` is full."""
    with open(disk / "filler", "wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)
    assert shutil.disk_usage(disk).free < 8192
