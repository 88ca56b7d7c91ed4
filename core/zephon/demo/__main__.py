"""``python -m zephon.demo``: the seed's pipeline on the embedded corpus, explained.

Prints the first batch's tensor shapes, one packed row laid out token by token (where each
document starts, its positions, and which labels count toward the loss), the loader's throughput
and report. ``make demo`` follows it with a short TorchTitan training
(``python -m zephon_torchtitan_tools.demo``); the core itself imports no adapter.
"""

from __future__ import annotations

import argparse
import sys
import time

from zephon import Pipeline, SampleBatch
from zephon.demo.assets import build_demo_assets
from zephon.io import Dataset
from zephon.text.tokenizer import load_tokenizer
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def explain_row(batch, tokenizer, eos_token_id: int, width: int = 24) -> str:
    """The row of ``batch`` with the most documents, token by token around a boundary."""
    record = max(batch.records, key=lambda r: len(r.meta["documents"]))
    out = SampleBatch([record]).to_training(
        return_labels=True, return_loss_mask=True, eos_mask_loss=True,
        eos_token_id=eos_token_id, return_cu_seqlens=True, flatten=True)
    tokens = out["input_ids"].tolist()
    labels = out["labels"].tolist()
    positions = out["positions"].tolist()
    lines = [f"row {record.meta['id']}: {len(record.meta['documents'])} document piece(s), "
             f"{record.meta['padding']} padding token(s)"]
    for span in record.meta["documents"]:
        lines.append(f"  {span.doc_id}: tokens {span.doc_start}..{span.doc_start + span.length}"
                     f" of the document at row offset {span.row_start}")
    lines.append(f"  cu_seqlens {out['cu_seqlens'].tolist()}")
    lines.append(f"  {'i':>4} {'input':<14} {'label':<14} {'pos':>4}  loss")
    boundary = next((i for i, p in enumerate(positions) if p == 0 and i > 0), width)
    shown = list(range(min(6, len(tokens))))
    shown += [i for i in range(max(boundary - 5, 0), min(boundary + 5, len(tokens)))
              if i not in shown]
    for i in sorted(shown):
        label = labels[i]
        lines.append(f"  {i:>4} {tokenizer.convert_ids_to_tokens(tokens[i])!s:<14.14} "
                     f"{(tokenizer.convert_ids_to_tokens(label) if label >= 0 else '-'):<14.14} "
                     f"{positions[i]:>4}  {'yes' if label >= 0 else 'no'}"
                     f"{'   <- new document' if positions[i] == 0 and i > 0 else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zephon.demo", description=__doc__)
    parser.parse_args(argv)

    print("Building the embedded corpus and tokenizer (first run only)...")
    assets = build_demo_assets()
    tokenizer = load_tokenizer(assets["tokenizer"])
    work_source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("demo", assets["corpus"])],
        mixture=MixtureSpec({"demo": 1.0}),
        seed=42,
        token_estimation=TokenEstimation(),
    )
    pipeline = (
        Pipeline(work_source)
        .tokenize(tokenizer_id=assets["tokenizer"], field="text")
        .pack_flat(max_length=257, algorithm="wrap")
        .batch(microbatch_size=8)
    )
    start = time.perf_counter()
    iterator = iter(pipeline)
    first = next(iterator)
    first_latency = time.perf_counter() - start
    tensors = first.to_training(return_labels=True)
    print(f"\nFirst batch after {first_latency:.2f} s: "
          + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))
    print("\nOne packed row (labels shifted by one; EOS -> next document not trained):")
    print(explain_row(first, tokenizer, tokenizer.eos_token_id))
    tokens = first.records[0].payload["input_ids"].size * len(first)
    for batch in iterator:
        batch.to_training(return_labels=True)
        tokens += sum(r.payload["input_ids"].size for r in batch.records)
    elapsed = time.perf_counter() - start
    print(f"\nOne pass over the corpus: {tokens:,} tokens in {elapsed:.2f} s "
          f"({tokens / elapsed:,.0f} tokens/s)")
    print(pipeline.report())

    return 0


if __name__ == "__main__":
    sys.exit(main())
