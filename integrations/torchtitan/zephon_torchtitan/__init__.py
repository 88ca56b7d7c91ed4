"""TorchTitan adapter for Zephon."""
