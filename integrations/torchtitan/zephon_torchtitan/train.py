"""TOML launch recipes: ``python -m zephon_torchtitan.train --toml FILE [--section.field V ...]``.

A launch recipe names a base TorchTitan config and changes it::

    [base]
    module = "llama3"                 # TorchTitan model name or an importable module
    config = "llama3_debugmodel"      # its config function
    vocab_size = "tokenizer"          # optional: size the model to the data tokenizer
    cpu = "auto"                      # CPU shims: "auto" (when CUDA is absent), true, false

    dump_folder = "outputs/smoke"     # top-level keys set Trainer.Config fields

    [training]                        # any Trainer.Config section, field by field
    seq_len = 128

    [dataloader]
    name = "zephon"                   # the only loader this launcher builds
    recipe = "data/pretrain.toml"     # ZephonDataLoader.Config fields; paths relative to FILE

    [validator.dataloader]            # optional, same keys
    name = "zephon"
    recipe = "data/validation.toml"

Precedence: command line > launch recipe > base config. Every key is checked against the
config it sets: an unknown section or field is an error naming the file and the key, raised
before any process group, model or data exists. ``hf_assets_path`` defaults to the data
recipe's tokenizer directory. The launcher then hands TorchTitan's own entry point
(``torchtitan.train.main``) a config function returning the prepared config, so the command
line is parsed by TorchTitan's ConfigManager and the run, torchrun included, is TorchTitan's.

Run without torchrun, it sets the single-process rendezvous variables (RANK=0, WORLD_SIZE=1,
MASTER_PORT=0: a port the kernel picks). ``--cpu`` forces the CPU shims
(:mod:`zephon_torchtitan_tools.cpu_shims`); nothing imports them on a machine with CUDA
unless asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from zephon import ConfigError
from zephon.distributed import single_process_env
from zephon.recipe import read_toml

_BASE_KEYS = {"module", "config", "vocab_size", "cpu"}
_prepared: Any = None


def launch_config() -> Any:
    """The config the launcher prepared (TorchTitan's ConfigManager calls this)."""
    if _prepared is None:
        raise RuntimeError("launch_config is set by `python -m zephon_torchtitan.train --toml`")
    return _prepared


def read_launch_recipe(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    data = read_toml(path, "launch recipe")
    base = data.get("base")
    if not isinstance(base, dict) or not base.get("module") or not base.get("config"):
        raise ConfigError(f"{path}: [base] needs module = <TorchTitan module> and "
                          "config = <config function>")
    unknown = sorted(set(base) - _BASE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown} in [base]; known: "
                          f"{sorted(_BASE_KEYS)}")
    return data


def wants_cpu(setting: Any, forced: bool) -> bool:
    if forced:
        return True
    if setting in (True, False):
        return bool(setting)
    if setting != "auto":
        raise ConfigError(f"[base] cpu must be true, false or \"auto\", got {setting!r}")
    import torch

    return not torch.cuda.is_available()


def base_config(module_name: str, function: str, source: str) -> Any:
    """Call ``function`` of a TorchTitan model name or an importable module."""
    candidates = [f"torchtitan.models.{module_name}.config_registry",
                  f"{module_name}.config_registry", module_name]
    for candidate in candidates:
        try:
            module = importlib.import_module(candidate)
        except ModuleNotFoundError:
            continue
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ConfigError(f"{source}: [base] config {function!r} is not a function of "
                              f"{candidate}")
        return fn()
    raise ConfigError(f"{source}: [base] module {module_name!r} cannot be imported (tried "
                      f"{candidates})")


def prepare(data: dict[str, Any], source: str, cpu: bool) -> Any:
    """A ``ZephonTrainer.Config``: the base config with the launch recipe applied."""
    from zephon_torchtitan.vocab import fit_vocab_size, follow_recipe_tokenizer

    base = data["base"]
    root = Path(source).parent
    config = base_config(base["module"], base["config"], source)
    settings = {k: v for k, v in data.items() if k != "base"}
    loader = settings.pop("dataloader", None)
    validator_loader = None
    if isinstance(settings.get("validator"), dict):
        settings["validator"] = dict(settings["validator"])
        validator_loader = settings["validator"].pop("dataloader", None)
    if loader is None:
        raise ConfigError(f"{source}: the launch recipe has no [dataloader] "
                          "(name = \"zephon\", recipe = ...)")
    _apply(config, settings, source, "")
    config.dataloader = _loader_config(loader, root, source, "dataloader")
    if validator_loader is not None:
        config.validator.dataloader = _loader_config(validator_loader, root, source,
                                                     "validator.dataloader")
    vocab = base.get("vocab_size")
    config.dataloader.tokenizer_from_recipe = "hf_assets_path" not in settings
    config.dataloader.fit_vocab = vocab == "tokenizer"
    follow_recipe_tokenizer(config, config.dataloader)  # again in the preflight, after the CLI
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        fit_vocab_size(config, vocab)
    elif vocab not in (None, "tokenizer"):
        raise ConfigError(f"{source}: [base] vocab_size must be \"tokenizer\" or an integer")
    if cpu:
        from zephon_torchtitan_tools.cpu_shims import apply_cpu_config

        apply_cpu_config(config)
    from zephon_torchtitan.config_checks import add_preflight
    from zephon_torchtitan.zephon_trainer import as_zephon_trainer

    trainer = as_zephon_trainer(config)
    return trainer if trainer is not None else add_preflight(config)


def _loader_config(table: Any, root: Path, source: str, where: str) -> Any:
    from zephon_torchtitan.dataloader import ZephonDataLoader

    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{where}] must be a table")
    table = dict(table)
    name = table.pop("name", None)
    if name != "zephon":
        raise ConfigError(f"{source}: [{where}] name = {name!r}; this launcher builds "
                          "name = \"zephon\" (use torchtitan.train for other loaders)")
    known = {f.name for f in dataclasses.fields(ZephonDataLoader.Config)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown option(s) {unknown} in [{where}]; known: "
                          f"{sorted(known)}")
    if not table.get("recipe"):
        raise ConfigError(f"{source}: [{where}] needs recipe = <data recipe TOML>")
    for key in ("recipe", "trace_dir"):
        if table.get(key):
            table[key] = str(root / os.path.expanduser(table[key]))
    try:
        return ZephonDataLoader.Config(**table)
    except ConfigError as exc:
        raise ConfigError(f"{source}: [{where}]: {exc}") from None


def _apply(target: Any, table: dict[str, Any], source: str, prefix: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    for key, value in table.items():
        where = f"{prefix}.{key}" if prefix else key
        if key not in fields or key.startswith("_") or key == "model_spec":
            section = f"[{prefix}]" if prefix else "the top level"
            raise ConfigError(f"{source}: unknown option {key!r} in {section}; known: "
                              f"{sorted(k for k in fields if not k.startswith('_'))}")
        current = getattr(target, key)
        if isinstance(value, dict):
            if not dataclasses.is_dataclass(current):
                raise ConfigError(f"{source}: {where} is a value, not a section")
            _apply(current, value, source, where)
            continue
        if dataclasses.is_dataclass(current):
            raise ConfigError(f"{source}: {where} is a section; write [{where}]")
        if not _compatible(current, value):
            raise ConfigError(f"{source}: {where} = {value!r} has the wrong type (the default "
                              f"is {current!r})")
        setattr(target, key, value)


def _compatible(current: Any, value: Any) -> bool:
    if current is None or (isinstance(current, str) and isinstance(value, str)):
        return True
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, (int, float)):
        return isinstance(value, (int, float)) and (isinstance(current, float)
                                                   or isinstance(value, int))
    return isinstance(value, type(current))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m zephon_torchtitan.train", add_help=False,
        description="Train with TorchTitan from a TOML launch recipe; other arguments are "
                    "TorchTitan's --section.field overrides (listed with --toml FILE --help).")
    parser.add_argument("--toml", help="launch recipe (recipes/torchtitan/)")
    parser.add_argument("--cpu", action="store_true", help="force the CPU shims")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    wants_help = any(a in ("-h", "--help") for a in rest)
    if wants_help:
        parser.print_help()
        if not args.toml:
            return
        print("\nTorchTitan's options, with the launch recipe's values as defaults:\n",
              flush=True)
    elif not args.toml:
        parser.error("the following arguments are required: --toml")
    for flag in ("--module", "--config"):
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            parser.error(f"{flag} comes from [base] of the launch recipe")
    data = read_launch_recipe(args.toml)
    cpu = wants_cpu(data["base"].get("cpu", "auto"), args.cpu)
    if cpu:
        from zephon_torchtitan_tools import cpu_shims

        cpu_shims.install()
    single_process_env()
    this = importlib.import_module("zephon_torchtitan.train")
    this._prepared = prepare(data, args.toml, cpu)

    from torchtitan.train import main as torchtitan_main

    sys.argv = [sys.argv[0], "--module", "zephon_torchtitan.train", "--config", "launch_config",
                *rest]
    torchtitan_main()


if __name__ == "__main__":
    main()
