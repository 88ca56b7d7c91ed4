"""Pipeline stages: who reads, what a stage without data runs on, and the loader state of
virtual pipelining through Megatron-LM's own checkpoint hook."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from megatron_helpers import CONTINUOUS, PACKED, megatron_argv, parse

from zephon_megatron.compat import iterator_with_state
from zephon_megatron.loss import make_forward_step
from zephon_megatron.provider import Topology, ZephonDatasetsProvider
from zephon_megatron.state_files import read_dataloader_states


class Recorder:
    """A model chunk that records what forward_step hands it."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, tokens, position_ids, attention_mask, **kwargs):
        self.calls.append({"tokens": tokens, "position_ids": position_ids,
                           "attention_mask": attention_mask, **kwargs})
        return torch.zeros(1)


class Untouchable:
    def __next__(self):
        raise AssertionError("a stage without data read the iterator")


def test_a_middle_stage_runs_without_reading() -> None:
    args = parse(megatron_argv(CONTINUOUS, masking=[]))
    step = make_forward_step(lambda: args, stage_reads=lambda vp, masking: False,
                             device=torch.device("cpu"))
    model = Recorder()
    step(Untouchable(), model)
    call = model.calls[0]
    assert call["tokens"] is None and call["labels"] is None and call["loss_mask"] is None
    assert call["attention_mask"].shape == (1, 1, 64, 64)  # the dense path's causal mask
    assert call["packed_seq_params"] is None


def test_stage_reads_follows_megatron_stages(megatron_cpu) -> None:
    from zephon_megatron.compat import stage_reads

    assert stage_reads(None, False) and stage_reads(None, True)  # one stage: first and last


def test_iterator_with_state_picks_the_reading_chunk() -> None:
    class Wrapped:
        def __init__(self, iterable):
            self.iterable = iterable

    class Reader:
        def save_state(self):
            return {}

    reader = Wrapped(Reader())
    assert iterator_with_state(reader) is reader
    assert iterator_with_state([None, reader]) is reader
    assert iterator_with_state([Wrapped(object()), None]) is None


@pytest.mark.skipif(importlib.util.find_spec("megatron.training") is None,
                    reason="Megatron-LM's megatron.training is not importable (megatron-core "
                    "0.19+ ships it; for 0.16 put a Megatron-LM checkout on PYTHONPATH)")
def test_virtual_pipeline_chunks_save_and_resume_through_megatron_hook(
        megatron_cpu, tmp_path: Path) -> None:
    """Virtual pipelining hands Megatron-LM's maybe_save_dataloader_state a list of per-chunk
    iterators; with the hook installed the reading chunk's state is written and restores."""
    from megatron.core.rerun_state_machine import RerunDataIterator
    from megatron.training import checkpointing

    from zephon_megatron.compat import install_checkpoint_hook

    args = parse(megatron_argv(CONTINUOUS, "--zephon-prefetch", "0", masking=[]))
    first_chunk_only = lambda vp, masking: vp == 0  # noqa: E731
    provider = ZephonDatasetsProvider(lambda: args, lambda: Topology(), first_chunk_only)
    chunks = [provider(None, vp_stage=vp)[0] for vp in (0, 1)]
    assert chunks[1] is None
    for _ in range(6):
        next(chunks[0])
    train_iterators = [RerunDataIterator(c) if c is not None else None for c in chunks]
    with pytest.raises(AttributeError):
        checkpointing.maybe_save_dataloader_state(train_iterators, 3, str(tmp_path))
    install_checkpoint_hook()
    install_checkpoint_hook()  # idempotent
    checkpointing.maybe_save_dataloader_state(train_iterators, 3, str(tmp_path))
    expected = next(chunks[0])["tokens"]
    resumed_args = parse(megatron_argv(CONTINUOUS, "--zephon-prefetch", "0",
                                       "--dataloader-save", str(tmp_path), masking=[]))
    resumed_args.iteration, resumed_args.consumed_train_samples = 3, 12
    again = ZephonDatasetsProvider(lambda: resumed_args, lambda: Topology(),
                                   first_chunk_only)(None, vp_stage=0)[0]
    assert len(read_dataloader_states(tmp_path, 3)) == 1
    assert torch.equal(next(again)["tokens"], expected)


def test_document_masking_reaches_every_stage() -> None:
    args = parse([*megatron_argv(PACKED), "--zephon-prefetch", "0"])
    step = make_forward_step(lambda: args, stage_reads=lambda vp, masking: masking,
                             device=torch.device("cpu"))
    provider = ZephonDatasetsProvider(lambda: args, lambda: Topology(),
                                      lambda vp, masking: masking)
    train = provider(None, vp_stage=1)[0]
    model = Recorder()
    step(train, model)
    assert model.calls[0]["attention_mask"].shape == (2, 1, 64, 64)  # per-document mask
