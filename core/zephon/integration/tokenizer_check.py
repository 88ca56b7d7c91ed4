"""The framework's tokenizer against the recipe's, before any token is trained.

The recipe's tokenizer makes every training id, and its EOS marks document boundaries; the
framework's tokenizer is the one it evaluates, generates and exports the model with. Another
vocabulary size or EOS id means another tokenizer, and a model read with ids it was not
trained on, so every adapter refuses it, in the same words, naming both tokenizers and the
option that fixes it. The recipe tokenizer's own EOS counts, not ``[to_training]
eos_token_id``, which may choose another boundary token on purpose.
"""

from __future__ import annotations

from typing import Any


def tokenizer_mismatch(recipe: Any, *, vocab: int | None, eos: int | None, theirs: str,
                       fix: str) -> str | None:
    """Why the framework's tokenizer (``vocab`` tokens, EOS id ``eos``: None where it does
    not say; ``theirs`` names it) cannot read the recipe's ids, ending with ``fix``; None
    when they agree or the recipe has no tokenizer (token-id data)."""
    from zephon.text.tokenizer import load_tokenizer

    name = recipe.tokenizer
    if name is None:
        return None
    ours = load_tokenizer(name)
    if vocab is not None and int(vocab) != len(ours):
        return (f"{recipe.source}: tokenizer {name!r} has {len(ours)} tokens but {theirs} "
                f"has {vocab}; {fix}")
    if eos is not None and ours.eos_token_id is not None and int(eos) != ours.eos_token_id:
        return (f"{theirs} ends documents with id {eos}, the recipe's tokenizer {name!r} "
                f"({recipe.source}) with {ours.eos_token_id}; they are different tokenizers, "
                f"and the model would be evaluated and exported with ids it was not trained "
                f"on. {fix}")
    return None
