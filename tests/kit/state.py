"""Helpers for tests that edit loader states: an edited state is sealed again, as someone who
edits a state on purpose would, so the loader's field checks (not only its checksum) meet it."""

from __future__ import annotations

from typing import Any

from zephon.artifacts import CHECKSUM, KIND
from zephon.engine.loader_state import sealed_entry


def resealed(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every lane entry that is a dict sealed again over its current fields
    (entries that are not dicts are left as they are, for the loader to refuse)."""
    return {key: sealed_entry({k: v for k, v in entry.items() if k not in (KIND, CHECKSUM)})
            if isinstance(entry, dict) else entry for key, entry in state.items()}
