"""Fixtures for the TorchTitan adapter tests.

The CPU shims are installed before anything imports TorchTitan (only when CUDA is absent),
exactly as the launcher does; trainings run in child processes through the launcher.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    from zephon_torchtitan_tools import cpu_shims

    cpu_shims.install()

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "torchtitan"


def write_recipe(path: Path, *, datasets: str, tokenizer: str = "demo:tokenizer",
                 lanes: int = 2, pack: str = "wrap", shuffle: bool = False,
                 to_training: str = 'eos_mask_loss = true\nposition_mode = "preserve"',
                 extra: str = "") -> Path:
    path.write_text(f"""\
seed = 7
lanes = {lanes}
prefetch = 0
{datasets}
[mixture]
by = "documents"
[work]
shuffle_units = {str(shuffle).lower()}
shuffle_rows = {str(shuffle).lower()}
[tokenize]
tokenizer = "{tokenizer}"
[pack]
algorithm = "{pack}"
[to_training]
return_labels = true
{to_training}
{extra}
""")
    return path


def demo_dataset(name: str = "demo") -> str:
    return f'[[datasets]]\nname = "{name}"\npath = "demo:corpus"\n'


@pytest.fixture(scope="session")
def demo_assets() -> dict[str, str]:
    from zephon.demo.assets import build_demo_assets

    return build_demo_assets()


@pytest.fixture
def docs_dir(tmp_path: Path):
    """A factory: a directory with one JSONL file holding the given texts, in order."""

    def make(texts: list[str], name: str = "docs") -> Path:
        directory = tmp_path / name
        directory.mkdir()
        with open(directory / "part-0.jsonl", "w") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": f"{name}-{i}", "text": text}) + "\n")
        return directory

    return make


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2048-token BPE: fits the stock llama3 debug model (for the override route)."""
    from zephon.demo.assets import make_documents, train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer2048")
    return train_tokenizer(make_documents(400, seed=3), out, vocab_size=2048)


@pytest.fixture(scope="session")
def recipes():
    """Recipe helpers: ``recipes.write(path, datasets=..., ...)``, ``recipes.demo()``."""

    class Recipes:
        write = staticmethod(write_recipe)
        demo = staticmethod(demo_dataset)
        root = RECIPES

    return Recipes
