"""Local glob patterns: glob's matches, each real folder walked once, link loops included."""

from __future__ import annotations

import glob
import os
import time

import pytest

from zephon.io import local_glob
from zephon.io.dataset import Dataset


def tree(root) -> None:
    for path in ["a/x.parquet", "a/b/y.parquet", "a/b/c/z.jsonl", "a/.hidden/h.parquet",
                 "a/b/.h.parquet", "top.parquet", "d/e/f/g.parquet", "a/b/w[1].parquet"]:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")


@pytest.mark.parametrize("pattern", ["**/*.parquet", "a/**/*.parquet", "a/**", "**",
                                     "a/**/b/*", "*/**/?.parquet", "**/[xy].parquet",
                                     "**/[!x].parquet", "d/**/g.parquet", "a/*/*.parquet",
                                     "**/c/*"])
def test_the_same_matches_as_glob_without_links(tmp_path, pattern, monkeypatch):
    tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    expected = sorted(p.rstrip("/") for p in glob.glob(pattern, recursive=True))
    assert local_glob.expand(pattern) == [p for p in expected if p]
    absolute = str(tmp_path / pattern)
    assert local_glob.expand(absolute) == sorted(
        p.rstrip("/") for p in glob.glob(absolute, recursive=True))


def test_two_link_loops_are_walked_once(tmp_path):
    """``dir/self -> dir`` and ``dir/sub/up -> ..``: glob's walk grows exponentially here."""
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.jsonl").write_text('{"text": "one"}\n')
    (folder / "sub" / "b.jsonl").write_text('{"text": "two"}\n')
    os.symlink(folder, folder / "self")
    os.symlink("..", folder / "sub" / "up")
    start = time.perf_counter()
    found = local_glob.expand(str(folder / "**" / "*.jsonl"))
    assert time.perf_counter() - start < 5  # milliseconds; only a walk that grows does not fit
    assert found == [str(folder / "a.jsonl"), str(folder / "sub" / "b.jsonl")]
    dataset = Dataset.from_path("loops", str(folder / "**" / "*.jsonl"))
    assert sorted(os.path.basename(f.path) for f in dataset.files()) == ["a.jsonl", "b.jsonl"]
