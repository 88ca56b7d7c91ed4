"""The node-local shard cache through which remote data (Hub, object stores) is read.

- :mod:`~zephon.io.cache.shard_cache`: ``ShardCache``, whole remote files downloaded once per
  node, verified, and kept within a size limit.
- :mod:`~zephon.io.cache.private_files`: files and folders inside the cache's root, private to
  the user, no link followed, write failures named.
- :mod:`~zephon.io.cache.locks`: the advisory file locks the processes of a node share it by.
"""
