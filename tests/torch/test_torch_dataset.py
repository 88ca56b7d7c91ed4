"""zephon_torch: a recipe as a stateful IterableDataset in a plain PyTorch loop, under
torchdata's StatefulDataLoader and under accelerate, resuming token for token at W=1 and W=2
(and from one to the other)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from zephon.distributed import launcher_store
from zephon.errors import ConfigError
from zephon.integration import read_state
from zephon.text.tokenizer import load_tokenizer
from zephon_torch import ZephonIterableDataset

WORKER = Path(__file__).with_name("torch_worker.py")
SEQ_LEN = 32


def write_recipe(path: Path, data: dict[str, Path], tokenizer: str) -> Path:
    path.write_text(f"""
seed = 3
lanes = 4

[[datasets]]
name = "short"
path = "{data['short']}"

[[datasets]]
name = "long"
path = "{data['long']}"

[mixture]
by = "tokens"

[tokenize]
tokenizer = "{tokenizer}"
field = "text"

[pack]
algorithm = "wrap"

[shuffle]
buffer_size = 8

[batch]
microbatch_size = 2

[to_training]
return_labels = true
""")
    return path


@pytest.fixture
def recipe(tmp_path, two_datasets, tokenizer_dir) -> Path:
    return write_recipe(tmp_path / "recipe.toml", two_datasets, tokenizer_dir)


def digest(item: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(item):
        h.update(key.encode())
        h.update(item[key].numpy().tobytes())
    return h.hexdigest()[:16]


def digests(items) -> list[str]:
    return [digest(item) for item in items]


def whole_run(recipe: Path) -> list[str]:
    return digests(ZephonIterableDataset(recipe, seq_len=SEQ_LEN))


def test_items_are_training_microbatches_and_resume_exactly(recipe):
    reference = whole_run(recipe)
    assert len(reference) > 12 and len(set(reference)) == len(reference)
    first = ZephonIterableDataset(recipe, seq_len=SEQ_LEN)
    iterator = iter(first)
    item = next(iterator)
    assert item["input_ids"].shape == item["labels"].shape == (2, SEQ_LEN)
    assert torch.equal(item["input_ids"][:, 1:], item["labels"][:, :-1])
    for _ in range(4):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))  # plain data
    assert state["artifact"] == "loader_state" and state["scope"] == "rank"
    assert sorted(read_state(state, "saved").entries) == [f"lane_{lane}" for lane in range(4)]
    resumed = ZephonIterableDataset(recipe, seq_len=SEQ_LEN)
    resumed.load_state_dict(state)
    assert digests(resumed) == reference[5:]
    assert digests(resumed) == reference, "iterating again starts the data over"


def test_a_plain_loop_trains_on_it(recipe, tokenizer_dir):
    torch.manual_seed(0)
    vocab = len(load_tokenizer(tokenizer_dir))
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    dataset = ZephonIterableDataset(recipe, seq_len=SEQ_LEN, infinite=True)
    losses = []
    for item in islice(DataLoader(dataset, batch_size=None), 40):
        loss = torch.nn.functional.cross_entropy(model(item["input_ids"]).flatten(0, 1),
                                                 item["labels"].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])  # about 8.3 -> 6.9
    metrics = dataset.metrics()
    assert metrics["zephon/padding_share"] == 0  # wrap packing
    assert 0.9 < metrics["zephon/loss_share"] <= 1
    assert abs(metrics["zephon/realized/short"] + metrics["zephon/realized/long"] - 1) < 1e-9


@pytest.mark.parametrize("workers", [0, 1])
def test_stateful_dataloader_resumes_exactly(recipe, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    reference = whole_run(recipe)
    loader = StatefulDataLoader(ZephonIterableDataset(recipe, seq_len=SEQ_LEN),
                                batch_size=None, num_workers=workers)
    assert digests(islice(loader, 6)) == reference[:6]
    state = loader.state_dict()
    again = StatefulDataLoader(ZephonIterableDataset(recipe, seq_len=SEQ_LEN),
                               batch_size=None, num_workers=workers)
    again.load_state_dict(state)
    assert digests(again) == reference[6:]


def test_more_than_one_dataloader_worker_is_refused(recipe):
    loader = DataLoader(ZephonIterableDataset(recipe, seq_len=SEQ_LEN), batch_size=None,
                        num_workers=2)
    with pytest.raises(ConfigError, match="num_workers=2"):
        next(iter(loader))


def test_a_plain_dataloader_workers_state_is_refused_rather_than_replayed(recipe):
    """With a plain DataLoader worker the pipeline runs in the worker: the main process's
    copy has read nothing, so its state would restart the run. It says so and names the fix;
    without a worker the state is the delivered items' own."""
    dataset = ZephonIterableDataset(recipe, seq_len=SEQ_LEN)
    assert digests(islice(DataLoader(dataset, batch_size=None, num_workers=1), 4)) == \
        whole_run(recipe)[:4]
    with pytest.raises(ConfigError, match=r"a DataLoader worker handed the items out and "
                                          r"holds the state.*StatefulDataLoader"):
        dataset.state_dict()
    in_process = ZephonIterableDataset(recipe, seq_len=SEQ_LEN)
    assert len(list(islice(DataLoader(in_process, batch_size=None), 3))) == 3
    resumed = ZephonIterableDataset(recipe, seq_len=SEQ_LEN)
    resumed.load_state_dict(in_process.state_dict())
    assert digests(islice(resumed, 2)) == whole_run(recipe)[3:5]


def test_accelerate_prepare_is_refused_naming_the_fix(recipe):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    try:
        loader = Accelerator(cpu=True).prepare(
            DataLoader(ZephonIterableDataset(recipe, seq_len=SEQ_LEN), batch_size=None))
        with pytest.raises(ConfigError, match=r"accelerator\.prepare.*without prepare.*"
                                              r"register_for_checkpointing"):
            next(iter(loader))
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()


def test_readers_must_divide_the_lanes(recipe):
    from zephon.integration import RunGeometry

    dataset = ZephonIterableDataset(recipe, seq_len=SEQ_LEN, geometry=RunGeometry(0, 3))
    with pytest.raises(ConfigError, match=r"4 lanes cannot be shared by 3 .*\[1, 2, 4\]"):
        next(iter(dataset))


def run_job(tmp_path: Path, name: str, mode: str, world: int, recipe: Path, vocab: int, *,
            save_after: int | None = None, load_from: Path | None = None) -> list[list[str]]:
    """``world`` readers of one job; each reader's item digests."""
    config = {"mode": mode, "recipe": str(recipe), "seq_len": SEQ_LEN, "vocab": vocab,
              "save_after": save_after, "save_to": str(tmp_path / f"{name}-state"),
              "load_from": str(load_from) if load_from else None,
              "out": str(tmp_path / f"{name}.json"), "store": str(tmp_path / f"{name}-store")}
    config_file = tmp_path / f"{name}-config.json"
    config_file.write_text(json.dumps(config))
    store, env = None, {}
    if mode == "accelerate" and world > 1:
        store, env = launcher_store(world)
    procs = [subprocess.Popen(
        [sys.executable, str(WORKER), str(config_file)],
        env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r),
             "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
             "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
             "MASTER_PORT": env.get("MASTER_PORT", "0")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    del store
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    return [json.loads(Path(f"{config['out']}.rank{r}").read_text())["digests"]
            for r in range(world)]


def interleave(per_rank: list[list[str]]) -> list[str]:
    """The job's microbatches in global order: microbatch m is reader m % W's."""
    world = len(per_rank)
    return [per_rank[m % world][m // world] for m in range(sum(map(len, per_rank)))]


@pytest.mark.multiprocess
def test_two_readers_in_a_plain_loop_resume_at_one_and_back(recipe, tmp_path, tokenizer_dir):
    vocab = len(load_tokenizer(tokenizer_dir))
    reference = whole_run(recipe)
    two = run_job(tmp_path, "two", "loop", 2, recipe, vocab, save_after=3)
    assert interleave(two) == reference
    saved = [json.loads(p.read_text()) for p in sorted((tmp_path / "two-state").glob("*.json"))]
    (tmp_path / "merged.json").write_text(json.dumps(saved))  # every rank's, as a list
    one = run_job(tmp_path, "one", "loop", 1, recipe, vocab, load_from=tmp_path / "merged.json")
    assert one[0] == reference[6:]
    single = run_job(tmp_path, "single", "loop", 1, recipe, vocab, save_after=4)
    back = run_job(tmp_path, "back", "loop", 2, recipe, vocab,
                   load_from=tmp_path / "single-state" / "rank0.json")
    assert interleave(back) == reference[4:]
    assert single[0] == reference


@pytest.mark.multiprocess
def test_accelerate_saves_and_resumes_the_data_exactly(recipe, tmp_path, tokenizer_dir):
    vocab = len(load_tokenizer(tokenizer_dir))
    reference = whole_run(recipe)
    two = run_job(tmp_path, "two", "accelerate", 2, recipe, vocab, save_after=3)
    assert interleave(two) == reference
    one = run_job(tmp_path, "one", "accelerate", 1, recipe, vocab,
                  load_from=tmp_path / "two-state")
    assert one[0] == reference[6:]
