"""Execution internals: per-lane streams, mixing, and the per-rank iterator."""
