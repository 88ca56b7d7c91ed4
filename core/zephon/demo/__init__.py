"""The embedded default: a small corpus and BPE tokenizer built deterministically on first use."""
