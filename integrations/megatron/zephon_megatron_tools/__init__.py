"""Tools around the Megatron adapter, apart from what a training run imports
(:mod:`zephon_megatron`):

- :mod:`~zephon_megatron_tools.trace`: ``python -m zephon_megatron_tools.trace``, what was
  in an iteration of a run, from the run's folder (``--run``) or its own flags;
- :mod:`~zephon_megatron_tools.smoke`, :mod:`~zephon_megatron_tools.cpu_pretrain` and
  :mod:`~zephon_megatron_tools.cpu_shims`: megatron-core and Megatron-LM's ``pretrain()``
  trained on CPU through the adapter's own objects (``make smoke-megatron``); the shims live
  only here, and a GPU run never imports them;
- :mod:`~zephon_megatron_tools.gpu_check`: checks for machines with CUDA and Transformer
  Engine.
"""
