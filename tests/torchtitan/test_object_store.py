"""The TorchTitan adapter, unchanged, trains from an ``s3://``, ``gs://`` or ``az://`` recipe:
the same tensors as the same files on local disk, and a state that resumes at another
data-parallel size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.kit.object_stores import upload
from tests.objectstore.servers import started_store
from zephon.demo.assets import build_demo_assets
from zephon_torchtitan.dataloader import ZephonDataLoader


@pytest.fixture(params=["s3", "gs", "az"])
def store(request, monkeypatch, tmp_path):
    """Each store's test server, found through the environment as its cloud's tools find
    it: ``(scheme, server)``."""
    server = started_store(request.param, monkeypatch, tmp_path)
    yield request.param, server
    server.close()


def recipe(path: Path, data: str, tokenizer: str, cache: Path) -> Path:
    path.write_text(f"""\
seed = 7
lanes = 4
prefetch = 0
[[datasets]]
name = "web"
path = "{data}"
[mixture]
by = "documents"
[tokenize]
tokenizer = "{tokenizer}"
[pack]
algorithm = "wrap"
[to_training]
return_labels = true
eos_mask_loss = true
position_mode = "preserve"
[cache]
root = "{cache}"
""")
    return path


def loader(path: Path, rank: int = 0, world: int = 1) -> ZephonDataLoader:
    return ZephonDataLoader.Config(recipe=str(path)).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=64, local_batch_size=2)


def batches(dl, n: int) -> list:
    it = iter(dl)
    return [next(it) for _ in range(n)]


def test_torchtitan_trains_from_a_store_as_from_local_files(store, tmp_path):
    scheme, server = store
    assets = build_demo_assets()
    upload(server, "titan", Path(assets["corpus"]), prefix="corpus/")
    local = recipe(tmp_path / "local.toml", assets["corpus"], assets["tokenizer"],
                   tmp_path / "cache")
    remote = recipe(tmp_path / "remote.toml", f"{scheme}://titan/corpus/*.parquet",
                    assets["tokenizer"], tmp_path / "cache")
    expected = batches(loader(local), 6)
    got = batches(loader(remote), 6)
    for (want, want_labels), (have, have_labels) in zip(expected, got, strict=True):
        assert torch.equal(want["input"], have["input"])
        assert torch.equal(want["positions"], have["positions"])
        assert torch.equal(want_labels, have_labels)
    # two ranks over the store, then one rank resumes their state: the single rank's next batches
    ranks = [loader(remote, r, 2) for r in range(2)]
    iters = [iter(dl) for dl in ranks]
    for _ in range(2):
        for it in iters:
            next(it)
    state = {**ranks[0].state_dict(), **ranks[1].state_dict()}
    following = [next(it) for _ in range(2) for it in iters]
    single = loader(remote)
    single.load_state_dict(state)
    for (want, want_labels), (have, have_labels) in zip(following, batches(single, 4),
                                                          strict=True):
        assert torch.equal(want["input"], have["input"])
        assert torch.equal(want_labels, have_labels)
