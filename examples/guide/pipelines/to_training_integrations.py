"""The same batch, shaped for two training frameworks."""

from typing import Any

from zephon import SampleBatch


def for_torchtitan(batch: SampleBatch) -> dict[str, Any]:
    """One flat sequence per microbatch, with the count the loss normalizes by."""
    return batch.to_training(
        return_labels=True,
        flatten=True,
        return_padding_mask=True,
        return_num_valid_tokens=True,
    )


def for_megatron(batch: SampleBatch) -> dict[str, Any]:
    """[microbatch_size, sequence_length] tensors, a float loss mask, cu_seqlens."""
    return batch.to_training(
        return_labels=True,
        return_loss_mask=True,
        return_cu_seqlens=True,
        rename_fields={"input_ids": "tokens"},
    )


if __name__ == "__main__":
    from zephon import Pipeline
    from zephon.demo.assets import build_demo_assets
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    assets = build_demo_assets()
    work_source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("demo", assets["corpus"])],
        mixture=MixtureSpec({"demo": 1.0}),
        seed=42,
    )
    pipeline = (
        Pipeline(work_source)
        .tokenize(tokenizer_id=assets["tokenizer"], field="text")
        .pack_flat(max_length=257, algorithm="wrap")
        .batch(microbatch_size=4)
    )
    batch = next(iter(pipeline))
    for name, shaped in (("torchtitan", for_torchtitan(batch)),
                         ("megatron", for_megatron(batch))):
        print(name, {key: tuple(value.shape) for key, value in shaped.items()})
