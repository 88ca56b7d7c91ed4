"""Text to token ids: loading tokenizers, the encoding engines and what they refuse.

- :mod:`~zephon.text.tokenizer`: loading a tokenizer (local directory, Hub id, saved
  ``tokenizer.json``), ``TextEncoder`` (one engine for all documents of an operator, batched)
  and the errors for texts it cannot encode.
- :mod:`~zephon.text.fast_engine`: the ``fastokens`` engine behind ``engine="fastokens"``, used
  only where a self-check shows it gives the ``tokenizers`` backend's ids.
- :mod:`~zephon.text.long_text`: where a long text may be cut so that its slices tokenize to
  exactly the whole text's ids.
- :mod:`~zephon.text.pool_turns`: batch calls taking turns on the tokenizer's thread pool.
"""
