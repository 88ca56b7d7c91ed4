"""Data recipes: one TOML schema for the core, the TorchTitan adapter and the Megatron adapter.

A recipe fixes the data (datasets, weights, seed, lanes), how it is tokenized, packed, shuffled
and batched, and the ``to_training`` choices (the masking recipe). Frameworks supply what they
own: the context length (rows are packed to ``seq_len + 1``), the microbatch size and the
data-parallel rank and size. Example::

    seed = 42
    lanes = 8

    [[datasets]]
    name = "web"
    path = "data/web/*.parquet"     # relative to this file; or hf://...; or demo:corpus
    weight = 0.7

    [[datasets]]
    name = "wiki"
    path = "data/wiki"
    weight = 0.3

    [mixture]
    by = "tokens"                   # or "documents" (the default without estimation keys)
    repeat = ["wiki"]               # datasets that start a new epoch when they run out
    on_exhausted = "stop"           # or "drain"

    [[ops]]                         # per-document operators, in order, before tokenize
    op = "filter"                   # map, filter, or a registered operator / "pkg.mod:Spec"
    fn = "my_project.quality:keep"

    [tokenize]
    tokenizer = "demo:tokenizer"    # a directory (relative to this file), a Hub id, or demo:
    field = "text"

    [pack]
    algorithm = "wrap"              # max_length defaults to the framework's seq_len + 1

    [shuffle]
    buffer_size = 64

    [to_training]
    return_labels = true
    eos_mask_loss = true            # eos_token_id defaults to the tokenizer's EOS

Every key is checked: an unknown one, or a value of the wrong type, is an error naming the file,
the section and the key. The keys are not listed here but derived from the classes that own
them (:func:`recipe_schema`): the operator specs (``[tokenize]``, ``[pack]``, ``[shuffle]``,
``[batch]``, ``[[ops]]``), ``TokenEstimation`` and the work source's options (``[mixture]``,
``[work]``), ``CacheOptions`` (``[cache]``), ``TrainingOptions`` (``[to_training]``) and
``LoaderOptions`` (top-level ``lanes``, ``prefetch``, ``read_ahead_tokens``, ``workers``), so a
new field is a new key.

Mixing is by tokens when ``[mixture] by = "tokens"`` or any token-estimation key (``primer``,
``calibration_samples``, ``calibration_shards_max``) is given, by documents otherwise: the
same rule as the Python API, where passing ``token_estimation`` mixes by tokens.

``[[ops]]`` entries run before tokenization unless they set ``after_tokenize = true`` (then
they see ``input_ids``).
``demo:corpus`` and ``demo:tokenizer`` name the embedded demo corpus and tokenizer;
``demo:chat`` and ``demo:chat-tokenizer`` a synthetic chat corpus and a tokenizer with a
ChatML-style template, for SFT recipes (``[tokenize] kind = "chat"``).

The package: :mod:`~zephon.recipe.keys` (the keys, derived from the classes that own them),
:mod:`~zephon.recipe.parse` (reading TOML into checked values), :mod:`~zephon.recipe.data_recipe`
(``DataRecipe``: validation and what it builds), :mod:`~zephon.recipe.resolve` (the framework's
values filled in), :mod:`~zephon.recipe.schema` (key derivation and table reading),
:mod:`~zephon.recipe.presets` (what each adapter fixes in ``[to_training]``) and
:mod:`~zephon.recipe.checks` (the preflight: a recipe checked against a run).
"""

from zephon.recipe.data_recipe import DataRecipe, load_recipe
from zephon.recipe.keys import DatasetEntry, recipe_schema
from zephon.recipe.parse import RecipeProblems, read_toml
from zephon.recipe.presets import TrainingPreset
from zephon.recipe.resolve import FrameworkValues, ResolvedRecipe

__all__ = ["DataRecipe", "DatasetEntry", "FrameworkValues", "RecipeProblems", "ResolvedRecipe",
           "TrainingPreset", "load_recipe", "read_toml", "recipe_schema"]
