"""The zephon command: every subcommand on the demo recipe and on a broken one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from zephon.io import CacheOptions
from zephon.io.cache.shard_cache import CachedFile, ShardCache

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "torchtitan" / "data" / "pretrain_docmask.toml"


def zephon(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zephon.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def broken(tmp_path) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text('[[datasets]]\nname = "x"\npath = "nowhere"\n[tokenize]\n'
                    'tokenizer = "demo:tokenizer"\n')
    return path


def test_preview_in_the_terminal_and_as_html(tmp_path, broken):
    result = zephon("preview", str(DEMO), "--rows", "2", "--seq-len", "64")
    assert result.returncode == 0, result.stderr
    assert "\x1b[48;5;" in result.stdout and "lane0/row" in result.stdout
    page = tmp_path / "batch.html"
    assert zephon("preview", str(DEMO), "--out", str(page)).returncode == 0
    assert "<span" in page.read_text() and "position" in page.read_text()
    bad = zephon("preview", str(broken))
    assert bad.returncode == 1 and "nowhere" in bad.stderr


def test_preview_png_shows_padding(tmp_path):
    from matplotlib.image import imread

    images = {}
    for algorithm in ("wrap", "best_fit"):
        recipe = tmp_path / f"{algorithm}.toml"
        recipe.write_text(DEMO.read_text().replace('algorithm = "wrap"',
                                                   f'algorithm = "{algorithm}"'))
        out = tmp_path / f"{algorithm}.png"
        result = zephon("preview", str(recipe), "--rows", "4", "--seq-len", "256",
                        "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        images[algorithm] = imread(out)
    assert images["wrap"].shape == images["best_fit"].shape
    def padding_pixels(image):
        return int(np.isclose(image[..., :3], 0.86, atol=0.01).all(axis=-1).sum())

    # best_fit pads its rows, wrap never does: only the padded picture shows padding grey
    # (a few grey pixels elsewhere come from anti-aliased text).
    assert padding_pixels(images["best_fit"]) > 10 * max(padding_pixels(images["wrap"]), 100)
    assert not np.array_equal(images["wrap"], images["best_fit"])


def test_stats_and_check(broken):
    result = zephon("stats", str(DEMO), "--tokens", "20M")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "epochs" in result.stdout and "runs out" in result.stdout
    assert zephon("stats", str(broken)).returncode == 1
    assert zephon("check", str(DEMO)).returncode == 0
    assert zephon("check", str(broken)).returncode == 1
    assert zephon("stats", str(DEMO), "--tokens", "lots").returncode == 2


def fill(root: Path, n: int, size: int = 4000) -> list[CachedFile]:
    import hashlib

    cache = ShardCache(CacheOptions(enabled=True, root=str(root)))
    items = []
    for i in range(n):
        body = bytes([i]) * size
        item = CachedFile(f"part-{i}.parquet", size, "sha256:" + hashlib.sha256(
            body).hexdigest(), f"hf://org/data@abc/part-{i}.parquet")
        with cache.open(item, lambda out, body=body: out.write(body)):
            pass
        time.sleep(0.01)
        items.append(item)
    return items


def test_cache_ls_verify_and_prune(tmp_path):
    root = tmp_path / "cache"
    items = fill(root, 4)
    listing = zephon("cache", "ls", "--root", str(root))
    assert listing.returncode == 0 and "4 shard(s), 16,000 bytes" in listing.stdout
    assert "hf://org/data@abc/part-2.parquet" in listing.stdout
    assert zephon("cache", "verify", "--root", str(root)).returncode == 0
    shard = root / "shards" / items[1].key
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])  # same size, other bytes
    verify = zephon("cache", "verify", "--root", str(root))
    assert verify.returncode == 1 and "part-1.parquet: its bytes do not match" in verify.stderr
    assert not shard.exists()
    # A second process holds the oldest shard open: pruning to nothing leaves only it.
    holder = subprocess.Popen([sys.executable, "-c", f"""
import json, sys, time
from zephon.io import CacheOptions
from zephon.io.cache.shard_cache import CachedFile, ShardCache
item = CachedFile(**json.loads(sys.argv[1]))
with ShardCache(CacheOptions(enabled=True, root={str(root)!r})).open(item, None):
    print("open", flush=True)
    time.sleep(30)
""", json.dumps({"name": items[0].name, "size": items[0].size, "version": items[0].version,
                 "display": items[0].display})], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        pruned = zephon("cache", "prune", "--root", str(root), "--to", "0")
        assert pruned.returncode == 1  # the shard in use could not go
        assert [p.name for p in (root / "shards").iterdir()] == [items[0].key]
    finally:
        holder.kill()
        holder.wait()
    assert zephon("cache", "prune", "--root", str(root), "--to", "0").returncode == 0
    assert not any((root / "shards").iterdir())
    assert zephon("cache", "ls", "--root", str(tmp_path)).returncode == 1


def test_schema_lists_every_key_or_one_section(capsys):
    from zephon.cli import main

    assert main(["schema"]) == 0
    everything = capsys.readouterr().out
    for header in ("top level", "[[datasets]]", "[mixture]", "[pack]", "[to_training]"):
        assert f"\n{header}" in "\n" + everything
    assert main(["schema", "pack"]) == 0
    pack = capsys.readouterr().out
    assert pack.startswith("[pack]\n") and "max_open_bins (an integer; default 8)" in pack
    assert "[batch]" not in pack
    with pytest.raises(SystemExit):
        main(["schema", "packing"])
    assert "no section 'packing'; sections: top, datasets" in capsys.readouterr().err


def test_a_preset_reads_the_recipe_as_its_adapter_does(tmp_path, capsys):
    """A TorchTitan recipe may leave return_labels to the adapter: without --preset the
    check refuses it for that alone; with it, every real problem is listed and nothing
    else, and preview shows the adapter's own masking choice."""
    from zephon.cli import main

    recipe = tmp_path / "titan.toml"
    recipe.write_text(DEMO.read_text().replace("return_labels = true", "")
                      .replace("lanes = 4", "lanes = 3"))
    assert main(["check", str(recipe), "--world-size", "2"]) == 1
    assert "eos_mask_loss=True needs return_labels=True" in capsys.readouterr().err
    assert main(["check", str(recipe), "--world-size", "2", "--preset", "torchtitan"]) == 1
    titan = capsys.readouterr().err
    assert "1 problem(s)" in titan and "lanes" in titan and "return_labels" not in titan
    recipe.write_text(recipe.read_text().replace("lanes = 3", "lanes = 4"))
    assert main(["check", str(recipe), "--preset", "torchtitan"]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["check", str(recipe), "--preset", "torch"]) == 1  # the loop passes it as is
    assert "needs return_labels" in capsys.readouterr().err
    assert main(["check", str(recipe), "--preset", "megatron"]) == 0
    capsys.readouterr()
    conflict = tmp_path / "conflict.toml"
    conflict.write_text(recipe.read_text().replace("[to_training]",
                                                   "[to_training]\nignore_index = -1"))
    assert main(["check", str(conflict), "--preset", "torchtitan"]) == 1
    assert "ignore_index = -1 conflicts with TorchTitan, which needs -100" in \
        capsys.readouterr().err
    assert main(["preview", str(recipe), "--preset", "torchtitan", "--rows", "1"]) == 0
    assert main(["stats", str(recipe), "--preset", "torchtitan"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["schema", "to_training", "--preset", "torchtitan"]) == 0
    schema = " ".join(capsys.readouterr().out.split())
    assert "flatten (true or false; default true): TorchTitan's choice" in schema
    assert "return_labels (true or false; default true): fixed by TorchTitan" in schema

