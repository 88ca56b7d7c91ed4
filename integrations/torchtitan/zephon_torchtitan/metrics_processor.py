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

TorchTitan builds the metrics processor and the dataloader separately, from sibling configs.
A :class:`LoaderLink` placed in both (:func:`zephon_torchtitan.config_checks.install_loaders`
does it) joins them: the training loader attaches itself when it is built and the metrics
processor reads it from there. The validation loader gets no link.
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass, fields
from typing import Annotated, Any

import tyro
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger

from zephon.meter import metrics_line


class LoaderLink:
    """The training loader of one trainer, shared by its loader and metrics configs. It
    holds the loader weakly: a dropped loader is not kept alive for its metrics."""

    def __init__(self) -> None:
        self._loader: weakref.ref | None = None

    def attach(self, loader: Any) -> None:
        """Make ``loader`` the one this link reports; at exit, report a run that did not
        reach :meth:`ZephonMetricsProcessor.close` (stopped by Ctrl-C or an error)."""
        if self._loader is None:
            atexit.register(self._report_at_exit)
        self._loader = weakref.ref(loader)

    @property
    def loader(self) -> Any:
        return self._loader() if self._loader is not None else None

    def _report_at_exit(self) -> None:
        loader = self.loader
        if loader is not None:
            loader.summarize("stopped early")

    def __repr__(self) -> str:  # TorchTitan logs configs with repr() of odd fields
        return f"LoaderLink({'attached' if self.loader is not None else 'empty'})"


class ZephonMetricsProcessor(MetricsProcessor):
    """TorchTitan's metrics processor with the Zephon loader's metrics added."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        loader_link: Annotated[LoaderLink | None, tyro.conf.Suppress] = None
        """The training loader whose metrics are logged (not a command-line option)."""

    def log(self, step: int, global_avg_loss: float, global_max_loss: float,
            grad_norm: float, extra_metrics: dict[str, Any] | None = None) -> None:
        loader = self._loader()
        extra = dict(extra_metrics or {})
        if loader is not None:
            metrics = loader.metrics()
            extra.update(metrics)
            logger.info(metrics_line(step, metrics))
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def _loader(self) -> Any:
        link = self.config.loader_link
        return link.loader if link is not None else None

    def close(self) -> None:
        loader = self._loader()
        if loader is not None:
            loader.summarize("last step")
        super().close()


def as_zephon_metrics(config: MetricsProcessor.Config,
                      link: LoaderLink) -> ZephonMetricsProcessor.Config:
    """``config`` as a :class:`ZephonMetricsProcessor` config (the same field values) that
    reports the loader attached to ``link``."""
    values = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
    values["loader_link"] = link
    return ZephonMetricsProcessor.Config(**values)
