"""Entry module: Megatron-LM's ``pretrain()`` for GPT, with ``--dataloader zephon``.

Usage (one process per GPU; a Megatron-LM checkout on PYTHONPATH)::

    PYTHONPATH=/path/to/Megatron-LM torchrun --nproc-per-node 8 -m zephon_megatron.pretrain_gpt \\
        <Megatron flags> --calculate-per-token-loss --reset-position-ids \\
        --reset-attention-mask --eod-mask-loss --dataloader zephon \\
        --zephon-recipe recipes/megatron/pretrain_packed.toml --save ckpt --load ckpt

Errors found before Megatron-LM starts are printed by global rank 0 only (``RANK``); every
rank exits with the same status. megatron-core 0.16 ships only ``megatron.core``:
``pretrain()``, the model builders and Megatron's own ``pretrain_gpt.py`` live in a
Megatron-LM checkout. megatron-core 0.19 also
ships ``megatron.training``, enough for ``--dataloader zephon`` (the model is built from the
parsed arguments); ``--dataloader megatron`` still needs the checkout's ``pretrain_gpt.py``.
Where something is missing this module exits at once (status 2) saying what. The stock script
cannot be used as it is (its argument and dataset providers are fixed, and its get_batch hands
TE 2-D cu_seqlens), so this module calls ``pretrain()`` itself
(:func:`~zephon_megatron.compat.run_pretrain`, either version's signature):

- ``--dataloader megatron`` (the default): Megatron's own dataset provider and forward step
  from the checkout's ``pretrain_gpt.py``, i.e. the stock behaviour plus the adapter's flags;
- ``--dataloader zephon``: :class:`~zephon_megatron.provider.ZephonDatasetsProvider` and
  :func:`~zephon_megatron.loss.make_forward_step`; ``--dataloader-type`` defaults to
  ``external``, and unless the command line names a tokenizer Megatron gets a
  ``NullTokenizer`` sized to the recipe's tokenizer (the data arrives as token ids).

The command line is validated against the recipe before Megatron initializes
(:func:`preflight`), so a bad recipe or a conflicting flag fails in a second, naming the
problem. On CPU the same entry runs under :mod:`zephon_megatron_tools.cpu_pretrain`.

Megatron-LM's own ``pretrain_gpt.py`` rejects ``--dataloader zephon`` (its parser does not
know the flag). A script of one's own keeps its ``pretrain()`` call and takes the adapter's
parts from :func:`zephon_pretrain_parts` (``integrations/megatron/examples/own_pretrain_gpt.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_megatron.compat import megatron_core_version

MISSING_MEGATRON_LM = (
    "zephon_megatron.pretrain_gpt runs Megatron-LM's pretrain(), which is not importable here "
    "(missing: {missing}). {advice} Transformer Engine and a GPU are needed for real runs; "
    "`make smoke-megatron` exercises the adapter on CPU.")
"""The message of a missing Megatron-LM; ``advice`` from :func:`megatron_lm_advice`."""
MISSING_TRAINING_DEPENDENCY = (
    "zephon_megatron.pretrain_gpt: megatron.training imports {module!r}, which is not "
    "installed. Install Megatron-LM's training dependencies: pip install "
    "\"zephon[megatron-training]\"")


def megatron_lm_advice(missing: Sequence[str], version: str | None = None) -> str:
    """What to do about ``missing`` modules, for the installed megatron-core ``version``."""
    version = version if version is not None else megatron_core_version()
    tag = f"core_v{version}" if version else "the tag of your megatron-core"
    checkout = (f"clone Megatron-LM at {tag} (git clone --branch {tag} "
                "https://github.com/NVIDIA/Megatron-LM) and put the checkout on PYTHONPATH "
                "(PYTHONPATH=/path/to/Megatron-LM)")
    if version is None:
        return f"megatron-core is not installed: pip install megatron-core, then {checkout}."
    if "megatron.training" in missing:
        return (f"megatron-core {version} ships only megatron.core here; {checkout}.")
    return (f"megatron-core {version} ships megatron.training, but not "
            f"{', '.join(missing)} (the stock scripts of a Megatron-LM checkout, needed for "
            f"--dataloader megatron or for its model builders); {checkout}.")


def missing_message(missing: Sequence[str]) -> str:
    return MISSING_MEGATRON_LM.format(missing=", ".join(missing),
                                      advice=megatron_lm_advice(missing))


def global_rank() -> int:
    """``RANK`` as torchrun sets it (0 outside a launcher)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def report(message: str) -> None:
    """Print an early error on global rank 0 only: every rank finds the same problem."""
    if global_rank() == 0:
        print(message, file=sys.stderr)


def missing_megatron_lm(dataloader: str = "zephon") -> list[str]:
    """Modules ``pretrain()`` needs that are not importable: Megatron-LM's training package,
    and for 0.16 its model builders (:func:`~zephon_megatron.compat.modules_for_pretrain`);
    ``--dataloader megatron`` also needs the checkout's stock ``pretrain_gpt``."""
    from zephon_megatron.compat import modules_for_pretrain

    required = modules_for_pretrain()
    if dataloader != "zephon":
        required = (*required, "pretrain_gpt")
    missing = []
    for name in required:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def zephon_args_defaults(settings: Any, argv: Sequence[str]) -> dict[str, Any]:
    """Megatron ``args_defaults`` for zephon runs: a NullTokenizer of the recipe tokenizer's
    size; for token-id data (``--data-path``), Megatron's own tokenizer flags, or a
    NullTokenizer of ``--vocab-size`` (else of the recipe's ``[tokenize] vocab_size``).
    Token-id data with none of these is refused: Megatron would need a tokenizer to size the
    model and fail inside its initialization."""
    if "--tokenizer-type" in argv:
        return {}
    from zephon.text.tokenizer import load_tokenizer
    from zephon_megatron.arguments import ZephonArgumentError, training_recipes

    recipe = training_recipes(settings)["train"]
    if recipe.tokenizer is None:
        if "--vocab-size" in argv:
            return {"tokenizer_type": "NullTokenizer"}
        bound = recipe.tokenize.get("vocab_size")
        if bound:
            return {"tokenizer_type": "NullTokenizer", "vocab_size": int(bound)}
        raise ZephonArgumentError(
            f"{recipe.source}: the data is token ids and the command line names neither the "
            "tokenizer they were written with nor a vocabulary size, which Megatron needs to "
            "size the model: pass --tokenizer-type and --tokenizer-model (e.g. "
            "--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR), or --vocab-size N "
            "(a NullTokenizer of N ids)")
    return {"tokenizer_type": "NullTokenizer", "vocab_size": len(load_tokenizer(
        recipe.tokenizer))}


def preflight(argv: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """(the ``--dataloader``, Megatron's ``args_defaults``) of a command line, checked before
    Megatron-LM is imported: with ``--dataloader zephon`` every recipe against the run
    (:func:`~zephon_megatron.arguments.settings_from_args`). Raises ``ConfigError`` naming
    every problem."""
    from zephon_megatron.arguments import (
        build_standalone_parser,
        check_megatron_dataloader,
        settings_from_args,
    )
    early, _ = build_standalone_parser().parse_known_args(list(argv))
    if early.dataloader != "zephon":
        check_megatron_dataloader(early)
        return early.dataloader, {"tokenizer_type": "GPT2BPETokenizer"}
    settings = settings_from_args(early)  # also checks the recipes against the run
    return "zephon", zephon_args_defaults(settings, list(argv))


@dataclass(frozen=True)
class ZephonPretrain:
    """What ``pretrain()`` takes from the adapter (:func:`zephon_pretrain_parts`)."""

    dataset_provider: Any
    """``train_valid_test_dataset_provider``."""
    forward_step: Any
    """``forward_step_func``: get_batch and the per-token loss."""
    extra_args_provider: Callable[[Any], Any]
    """The adapter's flags (and yours, when given), ``--dataloader-type external``."""
    args_defaults: dict[str, Any]
    """Megatron's ``args_defaults`` (the tokenizer Megatron builds when none is named)."""


def zephon_pretrain_parts(argv: Sequence[str] | None = None,
                          extra_args_provider: Callable[[Any], Any] | None = None
                          ) -> ZephonPretrain | None:
    """The adapter's parts for your own ``pretrain_gpt.py``, or None without ``--dataloader
    zephon`` (your script then runs as it is). Checks the command line (``sys.argv``) first:
    a problem is printed by global rank 0 alone and every rank exits with status 2. Installs
    the checkpoint hook virtual pipelining needs. ``extra_args_provider`` adds your own flags
    (it runs before the adapter's)."""
    from zephon.errors import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        dataloader, args_defaults = preflight(argv)
    except ConfigError as exc:
        report(f"zephon_megatron: {exc}")
        raise SystemExit(2) from None
    if dataloader != "zephon":
        return None
    return _zephon_parts(args_defaults, extra_args_provider, argv)


def _zephon_parts(args_defaults: dict[str, Any],
                  extra_args_provider: Callable[[Any], Any] | None = None,
                  argv: Sequence[str] = ()) -> ZephonPretrain:
    from megatron.training import get_args

    from zephon_megatron.arguments import make_extra_args_provider
    from zephon_megatron.compat import install_checkpoint_hook
    from zephon_megatron.loss import make_forward_step
    from zephon_megatron.provider import ZephonDatasetsProvider

    install_checkpoint_hook()  # virtual pipelining's per-chunk iterator lists
    provider = ZephonDatasetsProvider(get_args)
    provider.exit_on_error = True
    provider.command_line = tuple(argv)
    adapter = make_extra_args_provider("zephon")

    def extra_args(parser: Any) -> Any:
        return adapter(extra_args_provider(parser) if extra_args_provider else parser)

    return ZephonPretrain(provider, make_forward_step(get_args), extra_args, args_defaults)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from zephon.errors import ConfigError
    from zephon_megatron.arguments import make_extra_args_provider

    try:  # the recipes are checked before Megatron-LM is even imported
        dataloader, args_defaults = preflight(argv)
    except ConfigError as exc:
        report(f"zephon_megatron: {exc}")
        return 2
    missing = missing_megatron_lm(dataloader)
    if missing:
        report(missing_message(missing))
        return 2
    try:  # six, triton...: megatron.training's own imports
        import megatron.training  # noqa: F401
    except ModuleNotFoundError as exc:
        report(MISSING_TRAINING_DEPENDENCY.format(module=exc.name or str(exc)))
        return 2

    from zephon_megatron.compat import run_pretrain

    try:  # the stock script's embedding ranks where the checkout has it (0.16)
        from pretrain_gpt import get_embedding_ranks as embedding_ranks
    except ImportError:  # Megatron's default: the first and the last pipeline stage
        embedding_ranks = None
    zephon = _zephon_parts(args_defaults, argv=argv) if dataloader == "zephon" else None
    if zephon is not None:
        dataset_provider: Any = zephon.dataset_provider
        forward_step: Any = zephon.forward_step
        extra_args_provider = zephon.extra_args_provider
    else:
        import pretrain_gpt as stock  # Megatron-LM's script, from the checkout

        dataset_provider = stock.train_valid_test_datasets_provider
        dataset_provider.is_distributed = True
        forward_step = stock.forward_step
        extra_args_provider = make_extra_args_provider(dataloader)
    sys.argv = [sys.argv[0], *argv]  # Megatron parses sys.argv itself
    run_pretrain(dataset_provider, forward_step, extra_args_provider=extra_args_provider,
                 args_defaults=args_defaults, get_embedding_ranks=embedding_ranks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
