"""Progress bars for long work (Hub downloads, token estimation, building demo assets).

Shown on a terminal only: ``ZEPHON_PROGRESS=0`` turns them off, ``=1`` forces them (for
example into a log file), and by default they appear when standard error is a TTY. Bars are
tqdm's, written to standard error; they never change what the work does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any


def enabled() -> bool:
    setting = os.environ.get("ZEPHON_PROGRESS", "auto").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    if setting in ("1", "on", "true", "yes"):
        return True
    return sys.stderr.isatty()


def progress(iterable: Iterable[Any] | None = None, *, total: float | None = None,
             desc: str = "", unit: str = "it", show: bool = True, **options: Any) -> Any:
    """A tqdm bar (a silent one when progress is off or ``show`` is false); use as an
    iterable or with ``update()``."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit,
                disable=not (show and enabled()), leave=False, file=sys.stderr, **options)
