"""Where a process reads in the job, and the process groups its readers share.

Every adapter needs the same three facts from ``torch.distributed`` and the launcher: this
process's global rank (who prints the job's reports, whose trace file is whose), its
data-parallel rank and size (which lanes it reads), and a host group over the readers (to
agree on the end of the data and to sum the loader figures without touching the device).
They are read here once; adapters pass what their framework knows where it knows better
(Megatron's parallel state, Lightning's trainer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError


def distributed() -> bool:
    """Whether ``torch.distributed`` runs a process group of more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def global_rank() -> int:
    """This process's rank in the default group, else the launcher's ``RANK``, else 0: the
    rank that prints a job's reports is 0, and trace files are named by it."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        raise ConfigError(f"RANK={os.environ.get('RANK')!r} is not an integer") from None


@dataclass(frozen=True)
class RunGeometry:
    """Where this process reads in the data-parallel job."""

    dp_rank: int = 0
    """This reader's data-parallel rank, ``0 <= dp_rank < dp_size``."""
    dp_size: int = 1
    """Data-parallel readers of the job."""

    def __post_init__(self) -> None:
        if not (isinstance(self.dp_size, int) and self.dp_size >= 1
                and isinstance(self.dp_rank, int) and 0 <= self.dp_rank < self.dp_size):
            raise ConfigError(f"data-parallel rank {self.dp_rank!r} of size {self.dp_size!r}: "
                              "the size must be >= 1 and the rank in 0..size-1")

    @classmethod
    def from_environment(cls) -> RunGeometry:
        """Pure data parallelism: every process is a reader. The rank and size of the default
        ``torch.distributed`` group when it is initialized, else the launcher's ``RANK`` and
        ``WORLD_SIZE`` (torchrun, accelerate), else one reader."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size())
        except ImportError:
            pass
        try:
            return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
        except ValueError:
            raise ConfigError(f"RANK={os.environ.get('RANK')!r}, WORLD_SIZE="
                              f"{os.environ.get('WORLD_SIZE')!r}: not integers") from None


def reader_group(dp_size: int, *, required: bool = False) -> Any:
    """The host (gloo) group the readers agree over: the process-wide gloo group over the
    whole world (:func:`zephon.distributed.world_gloo_group`), or None for one reader.

    Over the whole world, not the data-parallel ranks alone: ranks that share a data-parallel
    rank (tensor-, pipeline- or context-parallel peers) read the same lanes and vote alike, so
    the minimum over the world is the minimum over the readers, and an adapter needs no mesh
    to find it. ``required``: several readers without an initialized process group are an
    error (they could not agree on the end of the data) instead of independent readers."""
    if dp_size == 1:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if required:
            raise ConfigError(f"{dp_size} data-parallel readers need torch.distributed "
                              "initialized (init_process_group) before the data is read: the "
                              "readers agree on the end of the data")
        return None
    from zephon.distributed import world_gloo_group

    return world_gloo_group()


def metrics_group(dp_size: int) -> tuple[Any, int]:
    """(group, replicas) for the job's loader figures (:class:`zephon.meter.LoaderMeter`): the
    readers' :func:`reader_group`, where each data-parallel rank's lanes are read by
    ``world / dp_size`` ranks (its model-parallel peers), whose figures count once."""
    group = reader_group(dp_size)
    if group is None:
        return None, 1
    import torch.distributed as dist

    return group, max(1, dist.get_world_size() // dp_size)


def host_group(group: Any) -> Any:
    """``group`` when it reduces host tensors (gloo), else None: the loader's figures and
    reports travel on the host, and a device group would synchronize the GPU for them."""
    if group is None:
        return None
    import torch.distributed as dist

    return group if "gloo" in str(dist.get_backend(group)).lower() else None
