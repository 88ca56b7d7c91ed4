"""The data recipe checked against the run, after TorchTitan parsed its config and before it
builds the model, and the Zephon loaders installed into the config.

TorchTitan builds the dataloader last (after the model, parallelization, the optimizer and,
on a cluster, the checkpoint load), so a recipe problem found there costs minutes.
:func:`install_loaders` runs earlier on every route:

- the launcher and the config registry: ``ZephonTrainer.init_distributed``
  (:mod:`zephon_torchtitan.zephon_trainer`), with the parsed config, once the process group exists;
- the override route (TorchTitan's own ``Trainer``): ``zephon_dataloader`` as it installs the
  loader, and ``zephon_preflight`` for a config whose loader is Zephon's already, inside
  ``Trainer.__init__`` before "Building <model>" (:mod:`zephon_torchtitan.override`).

:func:`preflight` runs :func:`zephon.integration.check_recipe` for the training and
validation recipes with the run's values: data-parallel size (``WORLD_SIZE`` over tensor x
pipeline x context parallel degrees), ``training.seq_len``, ``training.local_batch_size`` and
the model's vocabulary, and raises one ConfigError listing every problem.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from zephon import ConfigError
from zephon.integration import global_rank, refusal
from zephon_torchtitan import checkpoint_lanes

PREFLIGHT_IMPORT = "zephon_torchtitan.override.zephon_preflight"


FLAGS = {"seq_len": "--training.seq_len", "microbatch_size": "--training.local_batch_size",
         "vocab_size": "the model's vocab_size", "lanes": "--dataloader.lanes"}
"""The TorchTitan options behind each run value, named in conflicts."""


def run_values(root: Any) -> dict[str, int | None]:
    """The run's data-parallel size, sequence length, microbatch rows and vocabulary."""
    if root is None:
        return {}
    parallelism = root.parallelism
    model_ways = (max(1, parallelism.tensor_parallel_degree)
                  * max(1, parallelism.pipeline_parallel_degree)
                  * max(1, parallelism.context_parallel_degree))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = getattr(getattr(root, "model_spec", None), "model", None)
    return {"world_size": max(1, world // model_ways), "seq_len": root.training.seq_len,
            "microbatch_size": root.training.local_batch_size,
            "vocab_size": getattr(model, "vocab_size", None)}


def preflight(root: Any = None, replacing: dict[str, Any] | None = None, *,
              only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Check every Zephon loader of ``root`` (a ``Trainer.Config``; None: the recipes alone)
    against the run; raise a ConfigError listing every problem. ``replacing`` maps
    ``"dataloader"`` / ``"validator.dataloader"`` to a loader config about to be installed;
    ``only`` limits the check to those places.

    Returns the Zephon loader configs by place, the training loader's with the run's
    checkpoint folder filled in (``checkpoint_folder``, ``checkpoint_step``): the configs
    the caller installs."""
    from torchtitan.tools.logging import logger

    from zephon.integration import FrameworkValues, check_recipe
    from zephon_torchtitan.dataloader import ZephonDataLoader, default_lanes, read_recipe
    from zephon_torchtitan.vocab import follow_recipe_tokenizer

    replacing = replacing or {}
    loaders = [("dataloader", replacing.get("dataloader", getattr(root, "dataloader", None)))]
    validator = getattr(root, "validator", None)
    if "validator.dataloader" in replacing or (validator is not None
                                               and getattr(validator, "enable", False)):
        loaders.append(("validator.dataloader", replacing.get(
            "validator.dataloader", getattr(validator, "dataloader", None))))
    loaders = [(where, loader) for where, loader in loaders
               if isinstance(loader, ZephonDataLoader.Config)
               and (only is None or where in only)]
    checkpoint = getattr(root, "checkpoint", None)
    if checkpoint is not None and getattr(checkpoint, "enable", False):
        folder = os.path.join(root.dump_folder, checkpoint.folder)
        step = getattr(checkpoint, "load_step", -1)
        restart = 0
        if "dataloader" in getattr(checkpoint, "exclude_from_loading", []):
            found = checkpoint_lanes.checkpointed_lanes(folder, step)
            restart = checkpoint_lanes.step_of(found[0]) if found is not None else 0
        loaders = [(where, replace(loader, checkpoint_folder=folder, checkpoint_step=step,
                                   data_restart_step=restart)
                    if where == "dataloader" else loader) for where, loader in loaders]
    if root is not None and loaders and loaders[0][0] == "dataloader":
        follow_recipe_tokenizer(root, loaders[0][1], logger)
    values = run_values(root)
    problems: list[str] = []
    for where, loader in loaders:
        if not loader.recipe:
            continue
        try:
            recipe = read_recipe(loader.recipe)
        except ConfigError as exc:
            problems += getattr(exc, "problems", [str(exc)])
            continue
        lanes = loader.lanes
        if lanes is None and recipe.lanes is None and values.get("world_size"):
            lanes = default_lanes(values["world_size"], loader)[0]  # the loader's choice
        run = FrameworkValues(seq_len=values.get("seq_len"), dp_size=values.get("world_size"),
                              microbatch_size=values.get("microbatch_size")
                              if where == "dataloader" else None,
                              vocab_size=values.get("vocab_size"), lanes=lanes, flags=FLAGS)
        found = [f"[{where}] {p}" for p in check_recipe(recipe, values=run)]
        if lanes is not None and recipe.lanes is None:
            recipe = replace(recipe, lanes=lanes)
        if where == "dataloader":
            values["lanes"] = recipe.lanes
        if where == "dataloader" and not found:
            pipeline = functools.cache(functools.partial(one_reader, loader, recipe, values))
            found = [f"[{where}] {p}" for p in eos_problems(loader, recipe)
                     + resume_problems(root, loader, values, pipeline)]
            ends = None if found or global_rank() else data_ends(root, loader, recipe, values,
                                                                 pipeline)
            if ends:  # said once, by global rank 0, which alone estimates the data for it
                logger.warning(f"zephon: {ends}")
        if where == "dataloader" and loader.check_tokenizer:
            mismatch = _tokenizer_problem(root, recipe)
            found += [f"[{where}] {mismatch}"] if mismatch else []
        problems += found
    if problems:
        raise ConfigError(refusal(problems))
    checked = [loader.recipe for _, loader in loaders if loader.recipe]
    logger.info("zephon: preflight passed for %s (%s)", ", ".join(checked),
                ", ".join(f"{k} {v}" for k, v in values.items() if v is not None)
                or "recipe only")
    if loaders and loaders[0][0] == "dataloader" and loaders[0][1].recipe:
        record_run(root, loaders[0][1], values)
    return dict(loaders)


def record_run(root: Any, loader: Any, values: dict[str, Any]) -> None:
    """Write the run record into ``dump_folder`` (global rank 0), so that ``zephon trace
    DUMP_FOLDER --steps N`` needs nothing typed again (:mod:`zephon.integration.run_record`)."""
    from zephon.integration import RunRecord

    if root is None or global_rank() != 0 or not values.get("lanes") \
            or not values.get("world_size") or not getattr(root, "dump_folder", None):
        return
    local, dp = root.training.local_batch_size, values["world_size"]
    global_batch = getattr(root.training, "global_batch_size", -1)
    global_batch = global_batch if global_batch > 0 else local * dp
    checkpoint = getattr(root, "checkpoint", None)
    checkpoint = checkpoint if getattr(checkpoint, "enable", False) else None
    RunRecord(framework="torchtitan", recipe=os.path.abspath(loader.recipe),
              lanes=values["lanes"], dp_size=dp, microbatch_size=local,
              seq_len=root.training.seq_len, microbatches_per_step=global_batch // local,
              seed=loader.seed, checkpoints=checkpoint.folder if checkpoint else None,
              start_step=loader.data_restart_step).write(root.dump_folder)


def _tokenizer_problem(root: Any, recipe: Any) -> str | None:
    """TorchTitan's tokenizer (the tokenizer files under ``hf_assets_path``) against the
    recipe's, as the loader would find it after the model is built (None: they agree, or
    there is no TorchTitan tokenizer here to compare)."""
    from zephon.integration import tokenizer_mismatch
    from zephon.text.tokenizer import load_tokenizer
    from zephon_torchtitan.dataloader import TOKENIZER_FIX

    path = getattr(root, "hf_assets_path", None)
    if not path or not os.path.isfile(os.path.join(path, "tokenizer.json")) or \
            recipe.tokenizer is None or os.path.realpath(path) == \
            os.path.realpath(recipe.tokenizer):
        return None
    try:
        theirs = load_tokenizer(path)
    except ConfigError:
        return None  # TorchTitan names what is wrong with its own tokenizer
    return tokenizer_mismatch(recipe, vocab=len(theirs), eos=theirs.eos_token_id,
                              theirs=f"TorchTitan's tokenizer ({path})", fix=TOKENIZER_FIX)


def eos_problems(loader: Any, recipe: Any) -> list[str]:
    """With ``eos_mask_loss`` on token-id data, the EOS id against the data
    (:mod:`zephon.integration.eos_checks`): one the data cannot hold, or one no sampled
    document of an indexed dataset ends with, would mask nothing."""
    from zephon.integration import eos_mask_problems
    from zephon.recipe.presets import TORCHTITAN
    from zephon_torchtitan.dataloader import RECIPE_CHOICES

    if recipe.tokenizer is not None:
        return []  # the recipe's tokenizer makes the ids and ends every document
    try:
        options = TORCHTITAN.training_options(recipe, {"eos_mask_loss": loader.eos_mask_loss},
                                              choices=RECIPE_CHOICES)
    except ConfigError as exc:
        return [str(exc)]
    if not options.get("eos_mask_loss"):
        return []
    eos, fix = options["eos_token_id"], ("Set [to_training] eos_token_id to the id the "
                                         "documents end with, or eos_mask_loss = false")
    return eos_mask_problems(recipe, eos, f"[to_training] eos_token_id of {recipe.source}",
                             flag="eos_mask_loss", fix=fix)


def one_reader(loader: Any, recipe: Any, values: dict[str, Any]) -> Any:
    """The training loader's pipeline as one reader of the job builds it (``recipe`` with its
    lanes; the loader's seed), for the preflight's checks. One reader: the fingerprint and
    the data's length do not depend on the data-parallel size, and a build of the whole job
    on every rank must not take part in the ranks' cross-check. Built once for every check
    (planning reads every file's footer)."""
    if loader.seed is not None:
        recipe = replace(recipe, seed=loader.seed)
    return recipe.build(seq_len=values["seq_len"], microbatch_size=values["microbatch_size"],
                        lanes=recipe.lanes, prefetch=0)


def resume_problems(root: Any, loader: Any, values: dict[str, Any],
                    pipeline: Callable[[], Any]) -> list[str]:
    """The loader state of the checkpoint this run resumes from, against the loader it will
    build (``pipeline()``: :func:`one_reader`; :func:`zephon.integration.resume_problems`),
    read before the model is built (the checkpointer would load it after): one lane's entry,
    read alone from DCP. Nothing to say without a checkpoint, with the dataloader excluded from
    loading, or without the run's shape."""
    from zephon.integration import LoaderState
    from zephon.integration import resume_problems as resume_problems_of

    checkpoint = getattr(root, "checkpoint", None)
    if not loader.checkpoint_folder \
            or "dataloader" in getattr(checkpoint, "exclude_from_loading", []) \
            or not (values.get("world_size") and values.get("seq_len")):
        return []
    found = checkpoint_lanes.checkpointed_lanes(loader.checkpoint_folder,
                                                loader.checkpoint_step)
    if found is None or not found[1]:
        return []
    path, saved = found
    entry = checkpoint_lanes.checkpointed_entry(path, min(saved))
    if entry is None:
        return []
    return resume_problems_of(pipeline(), LoaderState({f"lane_{min(saved)}": entry},
                                                    max(saved) + 1), where=path,
                              restart="To keep the model and start the data over: "
                                      "--checkpoint.exclude_from_loading dataloader")


def data_ends(root: Any, loader: Any, recipe: Any, values: dict[str, Any],
              pipeline: Callable[[], Any]) -> str | None:
    """Where the training data ends before ``training.steps`` x the global batch
    (:func:`zephon.integration.data_supply`; ``pipeline()``: :func:`one_reader`), said before
    the model is built: TorchTitan then
    ends the run at the end of the data ("Ran out of data"), which may be the plan (one
    epoch) or a surprise. None for an ``infinite`` loader, data that lasts, or without the
    run's shape."""
    from zephon.integration import data_supply

    training = getattr(root, "training", None)
    steps, dp = getattr(training, "steps", None), values.get("world_size")
    if loader.infinite or not steps or not dp or not values.get("seq_len"):
        return None
    local = values["microbatch_size"]
    global_batch = getattr(training, "global_batch_size", -1)
    per_step = global_batch if global_batch > 0 else local * dp
    row = values["seq_len"] + 1
    supply = data_supply(recipe, pipeline(), row, local, dp)
    if supply is None or not supply.short_of(steps * per_step):
        return None
    names = ", ".join(repr(n) for n in supply.limiting)
    return (f"{recipe.source}: the training data ends before training.steps {steps}: "
            f"{names} not repeated, it yields {supply.described(row)}, about "
            f"{supply.rows // per_step} steps of {per_step} rows; the run will end there "
            f"(\"Ran out of data\"). To train all {steps} steps, add repeat = "
            f"[{', '.join(chr(34) + n + chr(34) for n in supply.once)}] to [mixture] or set "
            "--dataloader.infinite")


def install_loaders(root: Any, replacing: dict[str, Any] | None = None, *,
                    only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """:func:`preflight`, then the checked loader configs put in place in ``root`` (a
    ``Trainer.Config``), and its metrics processor made a
    :class:`~zephon_torchtitan.metrics_processor.ZephonMetricsProcessor` linked to the
    training loader (``zephon/`` metrics in TensorBoard and W&B). Returns the installed
    loader configs by place."""
    from zephon_torchtitan.metrics_processor import LoaderLink, as_zephon_metrics

    installed = preflight(root, replacing, only=only)
    if "dataloader" in installed:
        link = LoaderLink()
        installed["dataloader"] = replace(installed["dataloader"], metrics_link=link)
        root.metrics = as_zephon_metrics(root.metrics, link)
    for where, loader in installed.items():
        parent = root.validator if where == "validator.dataloader" else root
        parent.dataloader = loader
    return installed


def add_preflight(config: Any) -> Any:
    """Have TorchTitan run :func:`install_loaders` (through
    ``zephon_torchtitan.override.zephon_preflight``) before it builds the model of
    ``config``: for configs of a ``Trainer`` other than ``ZephonTrainer``."""
    imports = list(config.override.imports)
    if PREFLIGHT_IMPORT not in imports:
        imports.append(PREFLIGHT_IMPORT)
    config.override.imports = imports
    return config
