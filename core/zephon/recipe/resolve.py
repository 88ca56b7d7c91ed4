"""A recipe with the framework's values filled in (:class:`ResolvedRecipe`), and the values a
framework owns (:class:`FrameworkValues`): the row length, the microbatch rows, the lanes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zephon.recipe.data_recipe import DataRecipe

from dataclasses import dataclass, field
from typing import Any

from zephon.errors import ConfigError
from zephon.ops.base import OperatorSpec
from zephon.work.static_mixture import StaticMixtureWorkSource


@dataclass(frozen=True)
class FrameworkValues:
    """The values a framework owns. A recipe leaves them open (holes that
    :meth:`DataRecipe.resolve` fills) or fixes them, and then must agree."""

    seq_len: int | None = None
    """Tokens of input per row; rows are packed to ``seq_len + 1`` (the last label)."""
    microbatch_size: int | None = None
    """Rows per microbatch."""
    dp_size: int | None = None
    """Data-parallel readers of the job; they must divide the lanes."""
    lanes: int | None = None
    """The adapter's lanes where the recipe leaves them open: its own option, those of the
    checkpoint it resumes, or its default (:func:`zephon.integration.choose_lanes`)."""
    vocab_size: int | None = None
    """The model's vocabulary, which must hold every id of the recipe's tokenizer."""
    flags: dict[str, str] = field(default_factory=dict, compare=False)
    """The framework's option behind each value (``{"seq_len": "--training.seq_len"}``),
    named where a recipe disagrees."""

    def named(self, value: str) -> str:
        """`` (the option)`` behind ``value``, or nothing."""
        return f" ({self.flags[value]})" if value in self.flags else ""


@dataclass(frozen=True)
class ResolvedRecipe:
    """A recipe with the framework's values filled in: its datasets (listed), the operator
    specs in order and the lanes, ready to build a rank's Pipeline. Preflight checks and
    pipelines take it; it is made by :meth:`DataRecipe.resolve` and never changed."""

    recipe: DataRecipe
    values: FrameworkValues
    datasets: tuple[Any, ...]
    """The :class:`~zephon.io.Dataset` of each ``[[datasets]]`` entry, in order."""
    operators: tuple[OperatorSpec, ...]
    """Every operator spec: ``[[ops]]``, tokenizing, packing, shuffle, batch."""
    lanes: int | None
    """None: open (the pipeline's default)."""
    max_length: int | None
    """Tokens per packed row; None: no packing, or no sequence length yet."""
    microbatch_size: int | None
    """Rows per microbatch; None: no value from either side yet."""

    @property
    def source(self) -> str:
        return self.recipe.source

    def work_source(self) -> StaticMixtureWorkSource:
        """The work source of the recipe's datasets, mixture and work options."""
        return self.recipe._work_source(list(self.datasets))

    def build(self, *, dp_rank: int = 0, process_group: Any = None,
              prefetch: int | None = None, workers: int | None = None) -> Any:
        """The Pipeline of data-parallel rank ``dp_rank`` of ``values.dp_size``; with a saved
        plan (``plan = FILE``), its lanes unless the recipe or the framework sets them (then
        they must agree)."""
        from zephon.io import StoreOptions
        from zephon.pipeline import Pipeline

        recipe = self.recipe
        if recipe.pack is not None and self.max_length is None:
            raise ConfigError(f"{self.source}: [pack] max_length is not set and the "
                              "framework gave no sequence length")
        if self.microbatch_size is None:
            raise ConfigError(f"{self.source}: [batch] microbatch_size is not set and the "
                              "framework gave none")
        source = self.work_source()
        lanes = self.lanes
        saved = recipe.saved_plan()
        if saved is not None:
            saved.check(lanes, (source.hints.unit_bytes, source.hints.arrow_unit_rows))
            lanes = saved.lanes
        pipeline = Pipeline(source).options(
            io_options=StoreOptions(cache=recipe.cache) if recipe.cache is not None else None,
            lanes=lanes, dp_rank=dp_rank, dp_world_size=self.values.dp_size or 1,
            prefetch=prefetch if prefetch is not None else recipe.prefetch,
            read_ahead_tokens=recipe.read_ahead_tokens,
            workers=workers if workers is not None else recipe.workers,
            process_group=process_group)
        for spec in self.operators:
            pipeline = pipeline.apply(spec)
        return pipeline
