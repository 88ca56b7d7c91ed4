"""The lanes a resuming TorchTitan run's newest checkpoint holds loader state for.

The preflight (it sees the whole config) writes the run's checkpoint folder into the loader
config it checks (``ZephonDataLoader.Config.checkpoint_folder``); the loader, which TorchTitan
builds without the rest of the config, reads the lanes from there before DCP loads its state,
so a lane count that differs from the checkpoint's is refused in Zephon's words instead of as
a missing DCP key.
"""

from __future__ import annotations

import os
import re


def checkpointed_lanes(folder: str | None,
                       load_step: int = -1) -> tuple[str, set[int]] | None:
    """(checkpoint path, lanes with loader state in it) of the DCP checkpoint a run resumes
    from (``folder``: ``dump_folder/checkpoint.folder``; ``load_step`` -1: the newest), or
    None when there is none to resume."""
    if not folder or not os.path.isdir(folder):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(folder)
             if (m := re.fullmatch(r"step-(\d+)", name))
             and os.path.isfile(os.path.join(folder, name, ".metadata"))
             and load_step in (-1, int(m.group(1)))]
    if not steps:
        return None
    path = os.path.join(folder, max(steps)[1])
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(path).read_metadata().state_dict_metadata
    lanes = {int(m.group(1)) for key in keys if (m := re.fullmatch(r"dataloader\.lane_(\d+)",
                                                                    key))}
    return path, lanes


def step_of(path: str) -> int:
    """The training step of a DCP checkpoint folder (``.../step-<n>``)."""
    return int(re.fullmatch(r"step-(\d+)", os.path.basename(path.rstrip(os.sep))).group(1))


def checkpointed_entry(path: str, lane: int) -> dict | None:
    """The loader state entry of ``lane`` in the DCP checkpoint ``path`` (read alone, in
    this process, before any process group exists), or None where it cannot be read."""
    import warnings

    from zephon.errors import StateMismatchError
    from zephon.integration import state_from_text

    try:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    except ImportError:  # another torch: the restore still checks it, after the model
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        found = _load_state_dict_from_keys({f"dataloader.lane_{lane}"}, checkpoint_id=path)
    key = f"lane_{lane}"
    try:
        return state_from_text({key: found.get("dataloader", {}).get(key)}, path)[key]
    except StateMismatchError:
        return None  # not plain data from Zephon: the restore names what it holds
