"""Megatron adapter for Zephon: ``--dataloader zephon`` for Megatron-LM's ``pretrain()``.

Modules, one concern each:

- :mod:`~zephon_megatron.arguments`: the ``extra_args_provider`` (``--dataloader``,
  ``--zephon-recipe``, ...) and the checks of Megatron's flags against the data recipe;
  :mod:`~zephon_megatron.flags`: every data flag of Megatron-LM, read, kept or refused;
  :mod:`~zephon_megatron.args_checks`, :mod:`~zephon_megatron.eod_checks`: the preflight.
- :mod:`~zephon_megatron.vocabulary`: the model's vocabulary from the flags, and the recipe
  a run reads with it (one fingerprint for the preflight, the provider and the trace).
- :mod:`~zephon_megatron.provider`: the dataset provider; train/valid/test iterators yielding
  the Megatron preset, with ``save_state``/``restore_state`` keyed per lane.
- :mod:`~zephon_megatron.get_batch`: get_batch (tensor-parallel broadcast, THD PackedSeqParams for
  Transformer Engine, a dense document mask for local attention).
- :mod:`~zephon_megatron.loss`: forward_step and the per-token loss.
- :mod:`~zephon_megatron.pretrain_gpt`: ``python -m zephon_megatron.pretrain_gpt`` (needs a
  Megatron-LM checkout on PYTHONPATH), and ``zephon_pretrain_parts()`` for one's own script.
- the end-of-run report, trace files, the state envelope and the tokenizer check come from
  the integration kit (:mod:`zephon.integration`).
- Tools (tracing a run, CPU training, GPU checks) live apart, in :mod:`zephon_megatron_tools`.

Importing the package imports neither torch nor Megatron.
"""
