"""A length hint where the data allows: one Megatron indexed dataset, not repeated, packed with
``wrap``, has an exact number of microbatches a reader hands out in one pass; other data has
no length (``len()`` is a TypeError, so progress bars show counts without a total)."""

from __future__ import annotations

import operator

import pytest
from torch.utils.data import DataLoader

from tests.kit.token_ids import token_id_recipe
from zephon.integration import RunGeometry
from zephon_torch import ZephonIterableDataset


@pytest.fixture
def indexed_recipe(tmp_path):
    return token_id_recipe(tmp_path, "lanes = 4\nprefetch = 0\n",
                           "[to_training]\nreturn_labels = true\n")


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
