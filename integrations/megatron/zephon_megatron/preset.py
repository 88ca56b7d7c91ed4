"""The ``[to_training]`` values the Megatron batch layout fixes.

Megatron's ``get_batch`` reads ``tokens``, ``labels``, a float ``loss_mask`` and
``position_ids`` (plus ``cu_seqlens``/``max_seqlen`` under document masking), one
``[micro_batch_size, seq_length]`` tensor each. A recipe may leave these keys out; one that
states another value is refused, naming the key. The masking keys (``position_mode``,
``return_cu_seqlens``, ``eos_mask_loss``) are not fixed: Megatron's flags choose them (see
:func:`zephon_megatron.arguments.resolve_masking`).
"""

from __future__ import annotations

from zephon.recipe.presets import MEGATRON

PRESET_FIXED = MEGATRON.fixed
"""Keys whose value the Megatron batch layout fixes, with the only value it accepts."""
PRESET_LAYOUT = ("rename_fields", "exclude_fields")
"""Keys the adapter sets itself (Megatron's field names); a recipe may not give them."""
__all__ = ["MEGATRON", "PRESET_FIXED", "PRESET_LAYOUT"]
"""``MEGATRON``: what recipes read by the adapter are checked with
(:mod:`zephon.recipe.presets`)."""
