"""What each framework adapter fixes in ``[to_training]``, and what it chooses where a recipe
leaves a key out: one place that the adapters build with and that the ``zephon`` command
applies (``--preset``), so that ``zephon check`` passes exactly the recipes an adapter
accepts and refuses the same ones.

- TorchTitan trains on -100 labels and keeps the padding mask and valid-token count for its
  checks and reports; it masks the label after each EOS unless the recipe says otherwise (the
  next document's first token is not a prediction to learn under a document mask), and hands
  a microbatch as one flattened row unless the recipe sets ``flatten = false``.
- Megatron's ``get_batch`` reads ``tokens``, ``labels``, a float ``loss_mask`` and
  ``position_ids`` as ``[micro_batch_size, seq_length]`` tensors; its flags choose the masking
  keys (``position_mode``, ``return_cu_seqlens``, ``eos_mask_loss``).
- A plain PyTorch loop (``zephon_torch``) takes the recipe's keys as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainingPreset:
    """The ``[to_training]`` values a framework adapter fixes. A recipe may leave them out
    (they count as given where options are checked together: ``eos_mask_loss`` needs
    ``return_labels``), and a recipe value that contradicts one is an error naming it."""

    framework: str
    """The framework's name, for messages."""
    fixed: dict[str, Any]
    """``{to_training key: the value the adapter passes}``."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """``{to_training key: the adapter's choice where the recipe leaves the key out}``."""

    def applied(self, to_training: dict[str, Any]) -> dict[str, Any]:
        """A recipe's ``[to_training]`` as the adapter completes it: its defaults, then the
        recipe's keys, then the fixed values."""
        return {**self.defaults, **to_training, **self.fixed}

    def training_options(self, recipe: Any, overrides: dict[str, Any] | None = None, *,
                         choices: tuple[str, ...] | None = None,
                         say: Any = None) -> dict[str, Any]:
        """The ``SampleBatch.to_training`` options the adapter passes for ``recipe``.

        The recipe's ``[to_training]`` is checked against the preset: a fixed key with
        another value, or (``choices`` given) a key the framework does not use, is a
        ConfigError naming it. Then the preset's defaults, the recipe's keys, ``overrides``
        (the adapter's own options, None leaving a key as it is) and the fixed values are
        merged, in that order, and completed by the recipe (the tokenizer's EOS id). A
        default the recipe cannot meet (``eos_mask_loss`` with a tokenizer that has no EOS)
        is dropped, telling ``say``; the same value stated by the recipe or an override is
        an error."""
        from dataclasses import replace

        from zephon.errors import ConfigError

        chosen = dict(recipe.to_training)
        for key, value in chosen.items():
            if key in self.fixed and value != self.fixed[key]:
                raise ConfigError(f"{recipe.source}: [to_training] {key} = {value!r} conflicts "
                                  f"with {self.framework}, which needs {self.fixed[key]!r}")
            if choices is not None and key not in self.fixed and key not in choices:
                raise ConfigError(f"{recipe.source}: [to_training] {key} is not used with "
                                  f"{self.framework}. Keys a {self.framework} recipe may set: "
                                  f"{list(choices)}")
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        for key, value in given.items():
            if key in chosen and chosen[key] != value and say is not None:
                say(f"zephon: the adapter's {key}={value!r} replaces the recipe's "
                    f"{chosen[key]!r}")
        merged = {**self.defaults, **chosen, **given, **self.fixed}
        if not merged.get("eos_mask_loss"):
            merged.pop("eos_token_id", None)
        try:
            return replace(recipe, to_training=merged).training_options()
        except ConfigError:
            if "eos_mask_loss" in chosen or "eos_mask_loss" in given \
                    or not merged.get("eos_mask_loss"):
                raise
            if say is not None:
                say("zephon: eos_mask_loss = false: the tokenizer has no EOS token to mask "
                    "after (set [to_training] eos_token_id to mask one)")
            merged["eos_mask_loss"] = False
            return replace(recipe, to_training=merged).training_options()


TORCHTITAN = TrainingPreset(
    "TorchTitan",
    {"return_labels": True, "return_padding_mask": True, "return_num_valid_tokens": True,
     "ignore_index": -100},
    defaults={"eos_mask_loss": True, "flatten": True})
MEGATRON = TrainingPreset(
    "Megatron",
    {"return_labels": True, "return_loss_mask": True, "flatten": False,
     "return_num_valid_tokens": False, "return_padding_mask": False})
TORCH = TrainingPreset("torch", {})
PRESETS = {"torchtitan": TORCHTITAN, "megatron": MEGATRON, "torch": TORCH}
"""By the name ``--preset`` takes."""


def preset_schema(schema: dict, preset: TrainingPreset) -> dict:
    """``schema`` (:func:`zephon.recipe.recipe_schema`) with ``[to_training]`` as ``preset``'s
    adapter reads it: its fixed keys and its defaults shown as such."""
    import dataclasses

    keys = dict(schema["to_training"])
    for name, key in keys.items():
        if name in preset.fixed:
            keys[name] = dataclasses.replace(
                key, default=preset.fixed[name],
                doc=f"fixed by {preset.framework} (leave it out; another value is refused). "
                    + key.doc)
        elif name in preset.defaults:
            keys[name] = dataclasses.replace(
                key, default=preset.defaults[name],
                doc=f"{preset.framework}'s choice where the recipe leaves it out. " + key.doc)
    return {**schema, "to_training": keys}
