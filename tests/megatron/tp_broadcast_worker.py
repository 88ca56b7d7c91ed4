"""Worker of the tensor-parallel broadcast test (run as a script, one process per rank).

Tensor-parallel rank 0 builds the iterator through the provider; rank 1 has none and receives
every microbatch by broadcast. Each rank reports digests of what get_batch returned.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from megatron_helpers import PACKED, megatron_argv, parse


def digest(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, torch.Tensor):
        return hashlib.sha256(value.contiguous().numpy().tobytes()).hexdigest()[:16] + str(
            tuple(value.shape))
    return repr(value)


def main() -> None:
    out_path = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state

    from zephon_megatron.provider import ZephonDatasetsProvider

    parallel_state.initialize_model_parallel(2, 1)
    args = parse(megatron_argv(PACKED, "--tensor-model-parallel-size", "2", seq=256))
    reader = parallel_state.get_tensor_model_parallel_rank() == 0
    report = {"thd": [], "dense": []}
    for attention, batch_report in report.items():
        iterator = ZephonDatasetsProvider(lambda: args)(None)[0] if reader else None
        read(iterator, attention, batch_report)
        if iterator is not None:
            iterator.close()
        del iterator
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "reader": reader, "report": report})
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(gathered, handle)
    dist.barrier()
    gc.collect()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def read(iterator: object, attention: str, report: list[dict[str, object]]) -> None:
    from zephon_megatron.get_batch import get_batch

    for _ in range(8):
        batch = get_batch(iterator, attention=attention, device=torch.device("cpu"))
        params = batch.packed_seq_params
        report.append({
            "tokens": digest(batch.tokens), "labels": digest(batch.labels),
            "loss_mask": digest(batch.loss_mask), "position_ids": digest(batch.position_ids),
            "attention_mask": digest(batch.attention_mask),
            "cu_seqlens": digest(batch.cu_seqlens),
            "cu_len": None if batch.cu_seqlens is None else int(batch.cu_seqlens.numel()),
            "packed": None if params is None else [digest(params.cu_seqlens_q),
                                                   params.max_seqlen_q, params.qkv_format],
        })


if __name__ == "__main__":
    main()
