"""The keys a data recipe may hold, section by section, derived from the classes that own them
(operator specs, ``TokenEstimation``, the work source, ``CacheOptions``, ``TrainingOptions``,
``LoaderOptions``) and the recipe's own tables (``[[datasets]]``, the top level, ``[mixture]``,
``[tokenize]``, ``[[ops]]``)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from zephon.io.store_options import CacheOptions
from zephon.loader_options import LoaderOptions
from zephon.ops.batch import BatchSpec
from zephon.ops.pack import PackSpec
from zephon.ops.pretokenized import PretokenizedSpec
from zephon.ops.shuffle import ShuffleSpec
from zephon.ops.tokenize import TokenizeSpec
from zephon.ops.tokenize_chat import TokenizeChatSpec
from zephon.recipe.schema import Key, dataclass_keys, parameter_keys
from zephon.training import TrainingOptions
from zephon.work.estimation import TokenEstimation
from zephon.work.static_mixture import StaticMixtureWorkSource

MIX_SOURCE_KEYS = ("repeat", "on_exhausted")


WORK_SOURCE_KEYS = ("shuffle_units", "shuffle_rows", "unit_bytes", "arrow_unit_rows")


ESTIMATION_KEYS = tuple(f.name for f in dataclasses.fields(TokenEstimation))


TOKENIZERS = {"text": TokenizeSpec, "chat": TokenizeChatSpec, "pretokenized": PretokenizedSpec}


@dataclass
class DatasetEntry:
    name: str
    """Dataset name, used by the mixture and in every report."""
    path: str
    """Local file/dir/glob (relative to the recipe), ``hf://`` path, object-store path
    (``s3://bucket/prefix/*.parquet``; credentials and endpoint from the environment or the
    AWS profile files), or ``demo:corpus``."""
    weight: float = 1.0
    """Target share before normalization."""
    fmt: str | None = None
    """Force a file format (parquet, jsonl, arrow, megatron, mds, or a registered one)."""
    documents: list[int] | None = None
    """``[start, stop)``: read only these documents of a Megatron indexed dataset."""
    field: str | None = None
    """The column holding this dataset's documents, when it is not ``[tokenize] field``."""
    kind: str | None = None
    """``text``, ``chat`` or ``pretokenized`` for this dataset, when it is not ``[tokenize]
    kind``; it shares ``[tokenize]`` tokenizer and max_document_tokens."""
    add_bos: bool = False
    """A ``kind = "pretokenized"`` dataset in a recipe with a tokenizer: put the tokenizer's
    BOS before each of its documents, as text documents get it."""
    add_eos: bool = False
    """A ``kind = "pretokenized"`` dataset in a recipe with a tokenizer: put the tokenizer's
    EOS after each of its documents, as text documents get it (token ids written without a
    separator would otherwise run together; data that ends in EOD already needs none). Its
    ids are checked against the tokenizer's vocabulary either way."""


@dataclass(frozen=True)
class TopLevel:
    seed: int = 0
    """Seed of the unit and row orders (and of shuffles)."""
    plan: str = ""
    """A plan written by ``zephon plan`` (relative to this file): every rank takes the
    datasets' listings and units from it instead of listing and opening the files
    (:mod:`zephon.work.plan_file`)."""


@dataclass(frozen=True)
class MixtureChoice:
    by: str | None = None
    """``"tokens"`` or ``"documents"``. Default: tokens when a token-estimation key is given,
    documents otherwise."""
    stages: list[dict[str, Any]] | None = None
    """Shares that change as training goes on (``[[mixture.stages]]``): each stage has
    ``weights`` (a table of dataset names), ``until_tokens`` (tokens handed to the trainer by
    the whole job when it ends; the last stage runs to the end) and optionally
    ``ramp_tokens`` (move linearly from the previous stage's shares over that many tokens).
    The datasets' own ``weight`` keys are then not used. Mixing is by tokens. A resume may
    change the stages the run has not reached (:mod:`zephon.work.schedule`)."""


@dataclass(frozen=True)
class TokenizeChoice:
    kind: str = "text"
    """``"text"`` (tokenize), ``"chat"`` (tokenize_chat) or ``"pretokenized"`` (token ids
    already, e.g. Megatron indexed datasets)."""
    tokenizer: str = ""
    """A tokenizer directory (relative to the recipe), a Hub id, ``demo:tokenizer`` or
    ``demo:chat-tokenizer``."""


@dataclass(frozen=True)
class OpsEntry:
    op: str = ""
    """``map``, ``filter``, a registered operator's name, or ``"package.module:SpecClass"``."""
    after_tokenize: bool = False
    """Run after tokenization (the operator sees ``input_ids``) instead of before."""


@functools.cache
def recipe_schema() -> dict[str, dict[str, Key]]:
    """Every section's keys: ``""`` is the top level, ``tokenize.chat`` the chat variant and
    ``ops`` the keys every ``[[ops]]`` entry has besides its operator's own."""
    cache = {k: v for k, v in dataclass_keys(CacheOptions).items() if k != "enabled"}
    return {
        "": {**dataclass_keys(TopLevel), **dataclass_keys(LoaderOptions)},
        "datasets": dataclass_keys(DatasetEntry),
        "mixture": {**dataclass_keys(MixtureChoice), **dataclass_keys(TokenEstimation),
                    **parameter_keys(StaticMixtureWorkSource, MIX_SOURCE_KEYS)},
        "tokenize": {**dataclass_keys(TokenizeChoice),
                     **dataclass_keys(TokenizeSpec, exclude=("tokenizer_id",))},
        "tokenize.chat": {**dataclass_keys(TokenizeChoice),
                          **dataclass_keys(TokenizeChatSpec, exclude=("tokenizer_id",))},
        "tokenize.pretokenized": {"kind": dataclass_keys(TokenizeChoice)["kind"],
                                  **dataclass_keys(PretokenizedSpec)},
        "ops": dataclass_keys(OpsEntry),
        "pack": dataclass_keys(PackSpec),
        "shuffle": dataclass_keys(ShuffleSpec),
        "batch": dataclass_keys(BatchSpec),
        "to_training": dataclass_keys(TrainingOptions),
        "cache": cache,
        "work": parameter_keys(StaticMixtureWorkSource, WORK_SOURCE_KEYS),
    }


SECTIONS = ("datasets", "mixture", "tokenize", "ops", "pack", "shuffle", "batch",
             "to_training", "cache", "work")
