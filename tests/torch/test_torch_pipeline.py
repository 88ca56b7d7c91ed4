"""zephon_torch beyond a recipe file: a Pipeline built in Python, the shipped plain-loop
example and its recipe (a loop that saves and resumes model, optimizer and data)."""

from __future__ import annotations

import hashlib
from itertools import islice
from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon import Pipeline
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation
from zephon_torch import ZephonIterableDataset

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 32


def recipe_file(path: Path, data: dict[str, Path], tokenizer: str) -> Path:
    path.write_text(f"""seed = 3
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
[pack]
algorithm = "wrap"
max_length = {SEQ_LEN + 1}
[batch]
microbatch_size = 2
[to_training]
return_labels = true
""")
    return path


def python_pipeline(data: dict[str, Path], tokenizer: str) -> Pipeline:
    """The recipe above, written in Python."""
    source = StaticMixtureWorkSource([Dataset.from_path(n, p) for n, p in data.items()],
                                     MixtureSpec({"short": 1.0, "long": 1.0}), seed=3,
                                     token_estimation=TokenEstimation())
    return (Pipeline(source).options(lanes=4).tokenize(tokenizer_id=tokenizer)
            .pack_flat(SEQ_LEN + 1, "wrap").batch(2))


def digests(items) -> list[str]:
    out = []
    for item in items:
        h = hashlib.sha256()
        for key in sorted(item):
            h.update(key.encode() + item[key].numpy().tobytes())
        out.append(h.hexdigest()[:16])
    return out


def test_a_python_pipeline_gives_the_recipes_items_and_resumes(tmp_path, two_datasets,
                                                               tokenizer_dir):
    recipe = recipe_file(tmp_path / "r.toml", two_datasets, tokenizer_dir)
    reference = digests(ZephonIterableDataset(recipe, seq_len=SEQ_LEN))
    assert len(reference) > 10
    pipeline = python_pipeline(two_datasets, tokenizer_dir)
    training = {"return_labels": True}
    assert digests(ZephonIterableDataset(pipeline, to_training=training)) == reference
    first = ZephonIterableDataset(pipeline, to_training=training)
    taken = digests(islice(iter(first), 4))
    resumed = ZephonIterableDataset(pipeline, to_training=training)
    resumed.load_state_dict(first.state_dict())
    assert taken + digests(resumed) == reference


def test_a_python_pipeline_resumes_under_a_stateful_dataloader_worker(two_datasets,
                                                                      tokenizer_dir):
    pipeline = python_pipeline(two_datasets, tokenizer_dir)
    reference = digests(ZephonIterableDataset(pipeline))
    loader = StatefulDataLoader(ZephonIterableDataset(pipeline), batch_size=None,
                                num_workers=1)
    iterator = iter(loader)
    taken = digests(islice(iterator, 3))
    state = loader.state_dict()
    del iterator
    again = StatefulDataLoader(ZephonIterableDataset(pipeline), batch_size=None,
                               num_workers=1)
    again.load_state_dict(state)
    assert taken + digests(again) == reference


def test_a_pipeline_fixes_its_rows_and_a_recipe_its_tensors(tmp_path, two_datasets,
                                                            tokenizer_dir):
    pipeline = python_pipeline(two_datasets, tokenizer_dir)
    with pytest.raises(ConfigError, match="a pipeline fixes its rows"):
        ZephonIterableDataset(pipeline, seq_len=SEQ_LEN)
    recipe = recipe_file(tmp_path / "r.toml", two_datasets, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"follow its \[to_training\] table"):
        ZephonIterableDataset(recipe, to_training={"return_labels": True})


def test_the_example_loop_resumes_model_optimizer_and_data_exactly(tmp_path, capsys):
    import runpy

    main = runpy.run_path(str(REPO / "examples" / "torch" / "plain_loop.py"))["main"]
    recipe = str(REPO / "recipes" / "torch" / "pretrain.toml")
    assert main(["--recipe", recipe, "--steps", "7"]) == 0
    straight = capsys.readouterr().out.splitlines()
    assert main(["--recipe", recipe, "--steps", "4", "--save", str(tmp_path / "s4.pt")]) == 0
    capsys.readouterr()
    assert main(["--recipe", recipe, "--steps", "3", "--resume", str(tmp_path / "s4.pt")]) == 0
    resumed = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 2)[2] for line in resumed] == \
        [line.split(" ", 2)[2] for line in straight[4:]]
    assert all("labelled tokens" in line for line in straight)
