"""Tools around the TorchTitan adapter, apart from what a training run imports
(:mod:`zephon_torchtitan`):

- :mod:`~zephon_torchtitan_tools.cpu_shims`: what TorchTitan needs to train on CPU (smoke
  runs, tests); a GPU run never imports it. ``python -m zephon_torchtitan_tools.cpu_shims -m
  torchtitan.train ...`` runs TorchTitan's own entry point with them;
- :mod:`~zephon_torchtitan_tools.demo`: ``python -m zephon_torchtitan_tools.demo``, the
  bundled corpus trained with TorchTitan's debug model (``make demo``).
"""
