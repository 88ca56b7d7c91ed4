"""megatron-core's real GPTModel on CPU, fed by the adapter's iterator and get_batch.

A packed row with the dense document mask must give each document the logits it gets when it
runs alone; labels, loss_mask and position_ids must follow the masking the flags chose.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from megatron_helpers import CONTINUOUS, PACKED, megatron_argv, parse

from zephon_megatron.arguments import settings_from_args
from zephon_megatron.get_batch import TensorParallel, causal_mask, get_batch, thd_cu_seqlens
from zephon_megatron.provider import Topology, build_iterator

CPU = torch.device("cpu")


def iterator_for(recipe: Path, masking: list[str] | None = None, seq: int = 64, mbs: int = 2):
    from zephon.recipe import DataRecipe

    args = parse(megatron_argv(recipe, "--zephon-prefetch", "0", seq=seq, mbs=mbs,
                               masking=masking))
    settings = settings_from_args(args)
    return build_iterator(DataRecipe.from_toml(recipe), settings, Topology()), settings


def tiny_gpt(position_embedding: str, vocab: int = 4096, seq: int = 256):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32,
                               hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=vocab, max_sequence_length=seq,
                     position_embedding_type=position_embedding)
    return model.eval()


def segments(cu_row: torch.Tensor) -> list[tuple[int, int]]:
    bounds = [int(v) for v in cu_row if v >= 0]
    return list(itertools.pairwise(bounds))


@pytest.fixture(scope="module")
def packed_batch():
    iterator, settings = iterator_for(PACKED, seq=256)
    assert settings.attention == "dense"
    for _ in range(20):
        batch = get_batch(iterator, attention="dense", tp=TensorParallel(), device=CPU)
        if any(len(segments(row)) >= 2 for row in batch.cu_seqlens):
            return batch
    pytest.fail("no microbatch with two documents in a row")


@pytest.mark.parametrize("position_embedding", ["rope", "learned_absolute"])
def test_packed_documents_match_running_alone(megatron_cpu, packed_batch,
                                              position_embedding: str) -> None:
    model = tiny_gpt(position_embedding)
    batch = packed_batch
    with torch.no_grad():
        packed = model(batch.tokens, batch.position_ids, batch.attention_mask)
        crossing = model(batch.tokens, batch.position_ids, causal_mask(256))
        checked = differs = 0
        for row in range(batch.tokens.shape[0]):
            for start, end in segments(batch.cu_seqlens[row]):
                tokens = batch.tokens[row:row + 1, start:end]
                positions = batch.position_ids[row:row + 1, start:end]
                alone = model(tokens, positions, causal_mask(end - start))
                torch.testing.assert_close(packed[row, start:end], alone[0], atol=2e-5,
                                           rtol=1e-4)
                checked += 1
                if start > 0:
                    differs += not torch.allclose(crossing[row, start:end], alone[0],
                                                  atol=2e-5, rtol=1e-4)
    assert checked >= 3
    assert differs >= 1, "without the document mask later documents should see earlier ones"


def test_forward_step_loss_is_a_per_token_sum(megatron_cpu) -> None:
    from zephon_megatron.loss import make_forward_step

    args = parse(megatron_argv(PACKED, "--zephon-prefetch", "0"))
    iterator, _ = iterator_for(PACKED)
    model = tiny_gpt("rope", seq=64)
    forward_step = make_forward_step(lambda: args, tp=lambda: TensorParallel(),
                                     device=CPU)
    output, loss_fn = forward_step(iterator, model)
    loss, count, report = loss_fn(output)
    assert output.shape == (2, 64)
    assert 0 < int(count) < 128, "padding/EOS-masked labels are not counted"
    assert torch.isclose(loss / count, report["lm loss"][0] / report["lm loss"][1])
    assert 7.0 < float(loss / count) < 9.5  # about ln(4096) for an untrained model


def test_packed_recipe_choices_reach_the_batch() -> None:
    iterator, settings = iterator_for(PACKED, seq=256)
    assert settings.masking.position_mode == "preserve"
    eos = settings_eos(iterator)
    seen_eos = seen_reset = False
    for _ in range(6):
        data = next(iterator)
        tokens, labels, loss_mask = data["tokens"], data["labels"], data["loss_mask"]
        positions, cu = data["position_ids"], data["cu_seqlens"]
        assert loss_mask.dtype == torch.float32 and cu.dtype == torch.int32
        trained = loss_mask > 0
        assert torch.equal(labels[:, :-1][trained[:, :-1]], tokens[:, 1:][trained[:, :-1]])
        assert not bool(trained[tokens == eos].any()), "--eod-mask-loss: EOS -> next ignored"
        seen_eos |= bool((tokens == eos).any())
        for row in range(tokens.shape[0]):
            for start, end in segments(cu[row]):
                assert positions[row, start:end].tolist() == list(range(end - start))
                seen_reset |= start > 0
        packed = thd_cu_seqlens(cu, 256)
        covered = torch.zeros(tokens.numel(), dtype=torch.int64)
        for start, end in itertools.pairwise(packed.tolist()):
            covered[start:end] += 1
        assert bool((covered == 1).all()), "THD cu_seqlens cover each token exactly once"
    assert seen_eos and seen_reset


def test_continuous_recipe_choices_reach_the_batch() -> None:
    iterator, settings = iterator_for(CONTINUOUS, masking=[], seq=256)
    assert settings.masking.position_mode == "sequence"
    assert not settings.masking.document_masking
    eos = settings_eos(iterator)
    trained_after_eos = 0
    for _ in range(6):
        data = next(iterator)
        assert "cu_seqlens" not in data and "max_seqlen" not in data
        assert torch.equal(data["position_ids"], torch.arange(256).expand(2, 256))
        at_eos = data["tokens"] == eos
        trained_after_eos += int((data["loss_mask"][at_eos] > 0).sum())
    assert trained_after_eos > 0, "without --eod-mask-loss the EOS -> next label is trained"


def _tokenizer_dir() -> str:
    from zephon.recipe import DataRecipe

    return DataRecipe.from_toml(PACKED).tokenize["tokenizer"]


def settings_eos(_iterator) -> int:
    from zephon.text.tokenizer import load_tokenizer

    return int(load_tokenizer(_tokenizer_dir()).eos_token_id)
