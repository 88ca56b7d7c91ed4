"""Megatron adapter for Zephon."""
