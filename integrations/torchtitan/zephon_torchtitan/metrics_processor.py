"""Loader metrics in TorchTitan's own metrics processor, so TensorBoard and W&B get them.

:class:`ZephonMetricsProcessor` is TorchTitan's ``MetricsProcessor`` plus, at every log step,
the training loader's metrics under a ``zephon/`` prefix (and one console line):

- ``zephon/wait_ms``: mean time the trainer waited for a microbatch since the last log step;
- ``zephon/tokens_per_s``: tokens handed out per second of wall time since the last log step;
- ``zephon/padding_share``, ``zephon/loss_share``: of the tokens handed out since the last log
  step, the padding and the labels that count;
- ``zephon/realized/<dataset>`` and ``zephon/target/<dataset>``: realized and target mixture
  shares so far (tokens or documents, as the recipe mixes);
- ``zephon/dropped_documents``, ``zephon/filtered_documents``: so far.

At the end of the run the loader's report is logged once, by global rank 0: at the last step
(:meth:`ZephonMetricsProcessor.close`), when the data ends, or, for a run stopped early
(Ctrl-C, an exception: TorchTitan closes its trainer only on ``Exception``), by an exit hook.
The launcher and
the config registry install it (``zephon_torchtitan.override.zephon_metrics``); the override
route installs it with ``zephon_dataloader``. The training loader is the first Zephon loader a
process builds (TorchTitan builds the training loader before the validator's).
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass, fields
from typing import Any

from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger

from zephon.meter import metrics_line

_TRAINING: list[weakref.ref] = []


def register(loader: Any) -> None:
    """Remember ``loader`` as this process's training loader if it is the first one."""
    if not _TRAINING or _TRAINING[0]() is None:
        _TRAINING[:] = [weakref.ref(loader)]


def training_loader() -> Any:
    return _TRAINING[0]() if _TRAINING else None


@atexit.register
def _report_at_exit() -> None:
    """The end-of-run report of a run that did not reach :meth:`ZephonMetricsProcessor.close`
    (stopped by Ctrl-C or an error), if the training loader still exists."""
    loader = training_loader()
    if loader is not None:
        loader.summarize("stopped early")


class ZephonMetricsProcessor(MetricsProcessor):
    """TorchTitan's metrics processor with the Zephon loader's metrics added."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def log(self, step: int, global_avg_loss: float, global_max_loss: float,
            grad_norm: float, extra_metrics: dict[str, Any] | None = None) -> None:
        loader = training_loader()
        extra = dict(extra_metrics or {})
        if loader is not None:
            metrics = loader.metrics()
            extra.update(metrics)
            logger.info(metrics_line(step, metrics))
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def close(self) -> None:
        loader = training_loader()
        if loader is not None:
            loader.summarize("last step")
        super().close()


def as_zephon_metrics(config: MetricsProcessor.Config) -> ZephonMetricsProcessor.Config:
    """``config`` as a :class:`ZephonMetricsProcessor` config (the same field values)."""
    if isinstance(config, ZephonMetricsProcessor.Config):
        return config
    values = {f.name: getattr(config, f.name) for f in fields(config)}
    return ZephonMetricsProcessor.Config(**values)
