"""Your own Megatron-LM pretrain_gpt.py, with Zephon behind ``--dataloader zephon``.

Run it as you run Megatron-LM's script, from a checkout at the tag of your megatron-core:

    torchrun --nproc-per-node 8 own_pretrain_gpt.py <Megatron flags> --dataloader zephon ...

``zephon_pretrain_parts()`` checks the command line before Megatron-LM starts (a problem is
printed once, by rank 0, and every rank exits with status 2) and gives what ``pretrain()``
takes: the dataset provider, the forward step, the extra arguments (yours too) and the
``args_defaults``. Without ``--dataloader zephon`` it gives None and the script trains on
Megatron's own data path.
"""

import inspect
from functools import partial

from megatron.core.enums import ModelType
from megatron.training import pretrain

from zephon_megatron.pretrain_gpt import zephon_pretrain_parts


def add_my_args(parser):
    """Your own flags, as an ``extra_args_provider``."""
    parser.add_argument("--my-note", default=None)
    return parser


if __name__ == "__main__":
    zephon = zephon_pretrain_parts(extra_args_provider=add_my_args)
    if zephon is None:
        raise SystemExit("this example runs --dataloader zephon only; your script would call "
                         "pretrain() with its own provider and forward step here")
    if "args_defaults" in inspect.signature(pretrain).parameters:  # Megatron-LM <= 0.18
        from gpt_builders import gpt_builder
        from model_provider import model_provider

        pretrain(zephon.dataset_provider, partial(model_provider, gpt_builder),
                 ModelType.encoder_or_decoder, zephon.forward_step,
                 extra_args_provider=zephon.extra_args_provider,
                 args_defaults=zephon.args_defaults)
    else:  # Megatron-LM 0.19+: pretrain() takes a config built from the parsed arguments
        from megatron.training.argument_utils import (
            gpt_config_from_args,
            pretrain_cfg_container_from_args,
        )
        from megatron.training.arguments import parse_and_validate_args

        args = parse_and_validate_args(extra_args_provider=zephon.extra_args_provider,
                                       args_defaults=zephon.args_defaults)
        pretrain(pretrain_cfg_container_from_args(args, gpt_config_from_args(args)),
                 zephon.dataset_provider, ModelType.encoder_or_decoder, zephon.forward_step)
