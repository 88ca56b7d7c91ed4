"""A length hint where the data allows: one Megatron indexed dataset, not repeated, packed with
``wrap``, has an exact number of microbatches a reader hands out in one pass; other data has
no length (``len()`` is a TypeError, so progress bars show counts without a total)."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from torch.utils.data import DataLoader

from zephon.integration import RunGeometry
from zephon.io.indexed import write_indexed_dataset
from zephon_torch import ZephonIterableDataset


@pytest.fixture
def indexed_recipe(tmp_path):
    rng = np.random.default_rng(0)
    prefix = write_indexed_dataset(tmp_path / "web_text_document", [
        np.append(rng.integers(5, 900, size=int(rng.integers(10, 200))), 2)
        for _ in range(300)])
    path = tmp_path / "ids.toml"
    path.write_text(f'seed = 1\nlanes = 4\nprefetch = 0\n[[datasets]]\nname = "web"\n'
                    f'path = "{prefix}"\nfmt = "megatron"\n[tokenize]\nkind = "pretokenized"\n'
                    'vocab_size = 1000\n[pack]\nalgorithm = "wrap"\n[to_training]\n'
                    'return_labels = true\n')
    return path


def test_one_indexed_dataset_read_once_has_the_exact_length(indexed_recipe):
    one = ZephonIterableDataset(indexed_recipe, seq_len=64, microbatch_size=2)
    handed = sum(1 for _ in one)
    assert handed > 20 and len(one) == handed
    assert len(DataLoader(one, batch_size=None)) == handed
    readers = [ZephonIterableDataset(indexed_recipe, seq_len=64, microbatch_size=2,
                                     geometry=RunGeometry(r, 2)) for r in range(2)]
    two = {len(reader) for reader in readers}
    assert len(two) == 1  # every reader hands out as many
    each = two.pop()
    assert 0 <= handed - 2 * each < 2  # the last round leaves fewer than one per reader


def test_data_without_an_exact_count_has_no_length(indexed_recipe, tmp_path):
    endless = ZephonIterableDataset(indexed_recipe, seq_len=64, microbatch_size=2,
                                    infinite=True)
    with pytest.raises(TypeError, match="starts over"):
        len(endless)
    repeated = tmp_path / "repeated.toml"
    repeated.write_text(indexed_recipe.read_text() + '[mixture]\nrepeat = ["web"]\n')
    with pytest.raises(TypeError, match="repeats"):
        len(ZephonIterableDataset(repeated, seq_len=64, microbatch_size=2))
    assert operator.length_hint(ZephonIterableDataset(repeated, seq_len=64,
                                                      microbatch_size=2), -1) == -1
