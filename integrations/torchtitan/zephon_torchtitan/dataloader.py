"""``ZephonDataLoader``: a Zephon data recipe as a TorchTitan ``BaseDataLoader``.

TorchTitan builds the loader with its runtime values: the data-parallel rank and size of the
"batch" mesh (TP/CP/PP peers share a rank and get identical data), the tokenizer, and either
``seq_len`` + ``local_batch_size`` (0.3.0) or ``max_context_length`` + ``num_tokens_per_batch``
(TorchTitan main after 0.3.0). The recipe is packed to ``seq_len + 1`` tokens a row, so a row
gives ``seq_len`` inputs and labels; one microbatch of ``local_batch_size`` rows is one item of
the iterator.

What each item holds (the seed's TorchTitan preset: return_labels, flatten,
return_padding_mask, return_num_valid_tokens):

- ``({"input": ..., "positions": ...}, labels)``; labels are -100 wherever the loss must not
  look (padding always, the EOS -> next-BOS prediction with ``eos_mask_loss``). Keys of the
  input dict other than "input" go to ``model.forward``: only those its signature names are
  sent (0.3.0: positions). TorchTitan turns position resets into FlexAttention document masks,
  so ``position_mode="preserve"`` isolates packed documents and ``"sequence"`` isolates rows.
- Shapes: ``[1, B*S]`` (flattened; every row starts at position 0, so the logits equal the
  ``[B, S]`` layout's) or ``[B, S]`` with ``flatten = false``; with the post-0.3.0 kwargs a flat
  ``[T]``, which is what upstream main feeds its model.
- The padding mask and the valid-token count stay here: they check every batch (labels are
  -100 on padding, positions restart at 0 and grow by one, the count matches) and feed the
  padding/throughput report. They never reach ``forward``, which would reject them.

State: ``{"lane_<l>": lane entry as JSON text}`` for the lanes this rank owns (plain data:
nothing is unpickled when it is read back, :func:`zephon.integration.state_from_text`). Keys are
lane-unique, so TorchTitan's DCP checkpointer stores each lane once whichever rank wrote it,
and a fresh loader at any data-parallel size that divides the lane count finds its lanes
(its own ``state_dict()`` names the keys to fill). The entries describe the microbatches the
trainer consumed, never prefetched ones, and carry a fingerprint of the recipe: a changed
dataset, tokenizer, seed, packing or lane count is refused with a message naming it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.tools.logging import logger

from zephon import ConfigError, StateMismatchError
from zephon.integration import (
    EndOfRunReport,
    LoaderSession,
    TraceFile,
    check_training_batch,
    choose_lanes,
    metrics_group,
    reader_group,
    state_as_text,
    state_from_text,
    tokenizer_mismatch,
)
from zephon.recipe import DataRecipe, load_recipe
from zephon.recipe.presets import TORCHTITAN
from zephon_torchtitan.metrics_processor import LoaderLink

# to_training keys a TorchTitan recipe may choose (the preset, zephon.recipe.presets, fixes
# the others): it takes input, positions and -100 labels, and derives document boundaries
# from position resets.
RECIPE_CHOICES = ("eos_mask_loss", "eos_token_id", "position_mode", "flatten")


def read_recipe(path: str) -> DataRecipe:
    """A data recipe as TorchTitan runs it (the preset's keys may be left out), read once per
    process however many of TorchTitan's steps ask for it."""
    return load_recipe(path, preset=TORCHTITAN)


class ZephonDataLoader(BaseDataLoader):
    """A TorchTitan dataloader over a Zephon data recipe; see the module docstring."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = "zephon"
        """Label shown in TorchTitan's config dump; the data comes from ``recipe``."""

        recipe: str = ""
        """Path of the data recipe TOML (datasets, weights, tokenizer, packing, lanes, seed and
        the to_training choices; schema in ``zephon.recipe``). Relative paths inside it are
        relative to the recipe file."""

        fit_vocab: bool = False
        """Size the model's vocabulary (embedding, output layer, loss) to the recipe's
        tokenizer, in the preflight: after the command line is parsed, so the model follows
        the recipe actually used (``--dataloader.recipe`` included). The launcher's
        ``vocab_size = "tokenizer"`` and ``with_zephon`` set it."""

        tokenizer_from_recipe: bool = False
        """Point ``hf_assets_path`` (where TorchTitan builds its tokenizer) at the recipe's
        tokenizer directory, in the preflight, unless ``--hf_assets_path`` is on the command
        line. The launcher (without ``hf_assets_path`` in its TOML), ``with_zephon`` and the
        override route (with ``hf_assets_path`` at its default) set it."""

        lanes: int | None = None
        """Lane count when the recipe leaves it open (fixed for a run: any data-parallel size
        that divides it resumes the same data). Conflicting with the recipe is an error.
        Neither set: the lanes of the checkpoint being resumed, else 8 per data-parallel
        rank of this launch."""

        seed: int | None = None
        """Replaces the recipe's seed (a new data order; old checkpoints will be refused)."""

        eos_mask_loss: bool | None = None
        """Replaces the recipe's choice: ignore the EOS -> next-document label (TorchTitan's
        own loader never trains it). None keeps the recipe's value."""

        position_mode: Literal["preserve", "sequence"] | None = None
        """Replaces the recipe's choice: "preserve" restarts positions at every document (and
        TorchTitan then masks attention per document); "sequence" numbers each row 0..S-1 (one
        attention block per row). None keeps the recipe's value."""

        infinite: bool = False
        """Start over when the data runs out instead of ending training. The validator sets
        it from ``validator.steps`` (steps = -1: one finite pass)."""

        prefetch: int | None = None
        """0 runs the loader on the training thread; positive reads ahead on a background
        thread, within the recipe's ``read_ahead_tokens``. None keeps the recipe's."""

        check_batches: bool = True
        """Check every batch: labels -100 on padding, positions restart at 0 and grow by one
        below seq_len, valid-token count equals the labels that count. Cheap next to a
        training step (measured: docs/measurements.md)."""

        check_tokenizer: bool = True
        """Refuse to start when TorchTitan's tokenizer (``hf_assets_path``) has another
        vocabulary size or EOS id than the recipe's tokenizer."""

        report_every: int = 100
        """Log padding share, valid tokens and loader throughput every this many microbatches
        (0: never)."""

        checkpoint_folder: str = ""
        """Where the run's DCP checkpoints are (``dump_folder/checkpoint.folder``), and
        ``checkpoint_step`` the step it loads (-1: the newest). The preflight fills both when
        checkpointing is on: a resuming loader takes its open lane count from there and
        refuses another one before DCP loads its state."""

        checkpoint_step: int = -1
        """See ``checkpoint_folder``."""

        data_restart_step: int = 0
        """The training step at which this run's data starts over: the step of the checkpoint
        a run loads while excluding the dataloader from it (``--checkpoint.exclude_from_loading
        dataloader``). The preflight fills it; the loader state keeps it, so that
        ``zephon trace`` maps later steps to this data, and refuses earlier ones."""

        trace_dir: str = ""
        """If set, each rank appends one JSON line per microbatch it hands out to
        ``<trace_dir>/rank<r>.jsonl``: global microbatch index, lane, record ids and SHA-256 of
        the exact input, positions and labels tensors. For audits and resume tests."""

        metrics_link: Annotated[LoaderLink | None, tyro.conf.Suppress] = None
        """Where the trainer's metrics processor finds this loader (set with the metrics
        config by :func:`zephon_torchtitan.config_checks.install_loaders`; not a
        command-line option)."""

        def __post_init__(self) -> None:
            # Fail while the config is parsed, before any process group or model exists.
            if self.dataset not in ("zephon", ""):
                raise ConfigError(f"dataloader.dataset = {self.dataset!r} is not read by the "
                                  "Zephon loader: the data comes from dataloader.recipe "
                                  "([[datasets]] in the data recipe); remove it")
            if self.dataset_path is not None:
                raise ConfigError(f"dataloader.dataset_path = {self.dataset_path!r} is not "
                                  "read by the Zephon loader: name the data in the data "
                                  "recipe's [[datasets]] path; remove it")
            if self.recipe:
                read_recipe(self.recipe)
            for name in ("lanes", "report_every", "prefetch"):
                value = getattr(self, name)
                if value is not None and (not isinstance(value, int) or value < 0
                                          or (name == "lanes" and value == 0)):
                    raise ConfigError(f"dataloader.{name} must be a non-negative integer "
                                      f"(lanes: positive), got {value!r}")

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int,
                 tokenizer: Any = None, seq_len: int | None = None,
                 local_batch_size: int | None = None, max_context_length: int | None = None,
                 num_tokens_per_batch: int | None = None, **kwargs: Any):
        if not config.recipe:
            raise ConfigError("dataloader.recipe is empty: set it to a Zephon data recipe TOML "
                              "(see recipes/torchtitan/)")
        self.config = config
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self._seq_len, self._rows, self._flat_api = _geometry(
            seq_len, local_batch_size, max_context_length, num_tokens_per_batch)
        recipe = read_recipe(config.recipe)
        if config.seed is not None:
            recipe = replace(recipe, seed=config.seed)
        self.recipe = recipe
        # to_training always flattens; the recipe's "flatten" only picks the trainer's layout
        self.options = {**TORCHTITAN.training_options(
            recipe, {"eos_mask_loss": config.eos_mask_loss,
                     "position_mode": config.position_mode},
            choices=RECIPE_CHOICES, say=logger.info), "flatten": True}
        # [1, B*S] (the preset) unless the recipe asks for [B, S] rows.
        self._one_row = bool(recipe.to_training.get("flatten", True))
        if config.check_tokenizer and tokenizer is not None:
            _check_tokenizer(recipe, tokenizer)
        lanes = config.lanes
        if lanes is None and recipe.lanes is None:
            lanes, why = default_lanes(dp_world_size, config)
            logger.info(f"zephon: lanes = {lanes} ({why}; neither the recipe nor "
                        "--dataloader.lanes sets them)")
        self._pipeline = recipe.build(
            seq_len=self._seq_len, microbatch_size=self._rows, dp_rank=dp_rank,
            dp_world_size=dp_world_size, lanes=lanes, prefetch=config.prefetch,
            process_group=reader_group(dp_world_size))
        if config.data_restart_step:
            self._pipeline = self._pipeline.options(start_step=config.data_restart_step)
        group, replicas = metrics_group(dp_world_size)
        self._session = LoaderSession(self._pipeline, self.options, metrics_group=group,
                                      replicas=replicas)
        self.lanes = self._pipeline.lanes
        self._pipeline.fingerprint()  # plans the lanes now: a bad dp size fails at build time
        self._forward_keys = _forward_keys()
        self._trace = TraceFile.open(config.trace_dir)
        self._started = False  # iterated or restored: state_dict() is then for saving
        self._report = EndOfRunReport(self._session.meter, self._pipeline, group=group,
                                      rows=self._rows, row_tokens=self._seq_len + 1,
                                      say=logger.info)
        if config.metrics_link is not None:
            config.metrics_link.attach(self)
        logger.info(
            f"zephon: recipe {recipe.source}, lanes {self.lanes}, dp rank {dp_rank} of "
            f"{dp_world_size}, {self._rows} rows x {self._seq_len} tokens per microbatch, "
            f"eos_mask_loss={self.options.get('eos_mask_loss', False)}, "
            f"position_mode={self.options.get('position_mode', 'preserve')}")

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self):
        self._started = True
        for batch, out in self._session.batches(cycle=self.config.infinite, said=logger.info):
            yield self._convert(batch, out)
        self.summarize("end of data", job=True)  # the readers agreed on the end: all are here

    def _convert(self, batch: Any, out: dict[str, torch.Tensor]
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows, width = len(batch), self._seq_len
        if self.config.check_batches:
            check_training_batch(out, rows, width)
        inputs, positions, labels = out["input_ids"], out["positions"], out["labels"]
        if self._flat_api:
            shape: tuple[int, ...] = (rows * width,)
        elif self._one_row:
            shape = (1, rows * width)
        else:
            shape = (rows, width)
        inputs, positions, labels = (t.reshape(shape) for t in (inputs, positions, labels))
        input_dict = {"input": inputs}
        if "positions" in self._forward_keys:
            input_dict["positions"] = positions
        every = self.config.report_every
        if every and self._session.meter.totals["microbatches"] % every == 0:
            logger.info(f"zephon: {self.report()}")
        if self._trace is not None:
            self._trace.write(batch, self.lanes, self.dp_rank, self.dp_world_size,
                              {**input_dict, "labels": labels},
                              shape=list(input_dict["input"].shape),
                              valid_tokens=int(out["num_valid_tokens"].sum()),
                              padding_tokens=int(out["padding_mask"].sum()))
        return input_dict, labels

    # -- reporting -------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """``zephon/...`` metrics since the last call (see :mod:`zephon.meter`)."""
        return self._session.metrics()

    def summarize(self, why: str, job: bool = False) -> bool:
        """Log the end-of-run report (``why``: how the run ended) once, on global rank 0
        (:class:`zephon.integration.EndOfRunReport`): at the last step (the metrics
        processor's close), at the end of the data (``job``: the readers' figures summed), or
        at an interruption (an exit hook). Returns whether it was logged now."""
        return self._report.print(why, job=job)

    def stats(self) -> dict[str, float]:
        """Totals since construction: microbatches, tokens, padding and valid (loss-bearing)
        tokens, and the seconds the trainer waited for the loader."""
        return dict(self._session.meter.totals)

    def report(self) -> str:
        return self._session.meter.summary()

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"lane_<l>": JSON text}`` for this rank's lanes (consumed microbatches only)."""
        state = self._pipeline.state_dict()
        if not self._started:  # TorchTitan is about to load a checkpoint into these keys
            self._check_checkpointed_lanes(state)
        return state_as_text(state)

    def _check_checkpointed_lanes(self, state: dict[str, Any]) -> None:
        """Refuse, in Zephon's words, a checkpoint written with another lane count (DCP
        would only say that a key is missing)."""
        from zephon_torchtitan.checkpoint_lanes import checkpointed_lanes

        found = checkpointed_lanes(self.config.checkpoint_folder, self.config.checkpoint_step)
        if found is None or not found[1]:
            return
        path, lanes = found
        missing = sorted(int(key.split("_")[1]) for key in state if int(key.split("_")[1])
                         not in lanes)
        if missing or max(lanes) >= self.lanes:
            raise StateMismatchError(
                f"cannot resume the Zephon dataloader ({self.recipe.source}): the checkpoint "
                f"{path} holds loader state for {max(lanes) + 1} lanes, this run has "
                f"{self.lanes}. The lane count fixes the data of a run: resume with lanes = "
                f"{max(lanes) + 1}, or start a new run (--checkpoint.exclude_from_loading "
                "dataloader keeps the model and restarts the data).")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._started = True
        if not state_dict:
            return
        foreign = sorted(k for k in state_dict if not k.startswith("lane_"))
        if foreign:
            raise StateMismatchError(
                f"the checkpoint's dataloader state has keys {foreign[:4]}, which Zephon did "
                "not write: it comes from another dataloader. Start a new run, or exclude "
                "the dataloader from loading (--checkpoint.exclude_from_loading dataloader).")
        try:
            entries = state_from_text(state_dict, "the checkpoint's dataloader state")
            self._pipeline.load_state_dict(entries)
        except StateMismatchError as exc:
            raise StateMismatchError(f"cannot resume the Zephon dataloader ({self.recipe.source}"
                                     f", {self.lanes} lanes, dp size {self.dp_world_size}): "
                                     f"{exc} To keep the model and start the data over, pass "
                                     "--checkpoint.exclude_from_loading dataloader.") from None
        logger.info(f"zephon: resumed {len(entries)} lane state(s) at dp rank {self.dp_rank} "
                    f"of {self.dp_world_size}")


# -- helpers ---------------------------------------------------------------------------------
def default_lanes(dp_world_size: int, config: ZephonDataLoader.Config) -> tuple[int, str]:
    """(lanes, why) when neither the recipe nor the loader config sets them: those of the
    checkpoint the run resumes from (``config.checkpoint_folder``), else
    ``DEFAULT_LANES_PER_READER`` per data-parallel rank (:func:`zephon.integration.choose_lanes`),
    so that the run resumes with the same data at any data-parallel size dividing them."""
    from zephon_torchtitan.checkpoint_lanes import checkpointed_lanes

    found = checkpointed_lanes(config.checkpoint_folder, config.checkpoint_step)
    saved = max(found[1]) + 1 if found is not None and found[1] else None
    choice = choose_lanes(dp_world_size, saved=saved)
    if saved is not None:
        return choice.lanes, f"{choice.why}, {found[0]}"
    return choice.lanes, choice.why


def _geometry(seq_len: int | None, local_batch_size: int | None,
              max_context_length: int | None,
              num_tokens_per_batch: int | None) -> tuple[int, int, bool]:
    """(tokens per row, rows per microbatch, flat-[T] API) from either kwarg family."""
    if seq_len is not None:
        if local_batch_size is None:
            raise ConfigError("ZephonDataLoader was given seq_len without local_batch_size")
        return seq_len, local_batch_size, False
    if max_context_length is None or num_tokens_per_batch is None:
        raise ConfigError("ZephonDataLoader needs seq_len and local_batch_size (TorchTitan "
                          "0.3.0) or max_context_length and num_tokens_per_batch")
    if num_tokens_per_batch % max_context_length:
        raise ConfigError(f"num_tokens_per_batch={num_tokens_per_batch} is not a multiple of "
                          f"max_context_length={max_context_length}; Zephon packs whole rows")
    return max_context_length, num_tokens_per_batch // max_context_length, True


TOKENIZER_FIX = ("point --hf_assets_path at the recipe's tokenizer (and size the model's "
                 "vocabulary for it), or pass --dataloader.no-check-tokenizer if this is "
                 "intended")


def _check_tokenizer(recipe: DataRecipe, tokenizer: Any) -> None:
    vocab = tokenizer.get_vocab_size() if hasattr(tokenizer, "get_vocab_size") else None
    where = getattr(tokenizer, "tokenizer_path", "hf_assets_path")
    problem = tokenizer_mismatch(recipe, vocab=vocab, eos=getattr(tokenizer, "eos_id", None),
                                 theirs=f"TorchTitan's tokenizer ({where})", fix=TOKENIZER_FIX)
    if problem:
        raise ConfigError(problem)


def _forward_keys() -> frozenset[str]:
    """The keyword arguments the installed TorchTitan's decoder ``forward`` accepts."""
    from torchtitan.models.common.decoder import Decoder

    params = inspect.signature(Decoder.forward).parameters
    return frozenset(name for name in params if name not in ("self", "tokens"))
