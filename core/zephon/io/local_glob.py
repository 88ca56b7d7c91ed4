"""Local glob patterns expanded with each real folder visited once.

``glob.glob(pattern, recursive=True)`` follows directory links under ``**`` and walks every
path through them: a folder holding two link loops (``dir/self -> dir``, ``dir/sub/up -> ..``)
makes the number of paths grow exponentially with depth, and the expansion does not finish.
Here a pattern with ``**`` walks from its folder prefix (the part before the first wildcard)
with ``os.walk``, following links but entering each real folder (by ``realpath``) once, and
matches each path it passes against the pattern; a pattern without ``**`` goes to ``glob``,
which cannot loop (its depth is the pattern's).

Semantics kept from ``glob``: ``*``, ``?`` and ``[...]`` match within one path component,
``**`` any number of components (none included), and neither matches names starting with a
dot. A folder reached again through a link is not entered a second time, so its files are
listed under the first path that reached it (in ``os.walk``'s sorted order): a file has one
path, where ``glob`` would list it once per path through the links.
"""

from __future__ import annotations

import glob
import os
import re


def expand(pattern: str) -> list[str]:
    """The paths ``pattern`` matches, sorted (see the module's docstring)."""
    if "**" not in pattern:
        return sorted(glob.glob(pattern))
    parts = pattern.split("/")
    fixed = 0
    while fixed < len(parts) and not glob.has_magic(parts[fixed]):
        fixed += 1
    base = "/".join(parts[:fixed])
    start = base if base else "."
    if base == "" and pattern.startswith("/"):
        start = "/"
    regex = re.compile(_regex(parts))
    found: list[str] = []
    seen: set[str] = set()
    if base and regex.fullmatch(base) and os.path.isdir(base):
        found.append(base)
    for current, dirs, names in os.walk(start, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in [*dirs, *names]:
            if name.startswith("."):
                continue
            path = os.path.join(current, name)
            shown = path[2:] if start == "." and not base else path
            if regex.fullmatch(shown):
                found.append(shown)
    return sorted(found)


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as a compiled regex over ``/``-separated keys, with the semantics above
    (object-store listings match keys with it)."""
    return re.compile(_regex(pattern.split("/")))


def _regex(parts: list[str]) -> str:
    """A regex for a pattern split at ``/``: a middle ``**`` is zero or more components each
    with its ``/``; a last one, the folder itself or anything below it."""
    out = ""
    slash = ""  # what goes before the next component
    for index, part in enumerate(parts):
        if part != "**":
            out += slash + _component(part)
            slash = "/"
        elif index == len(parts) - 1:
            below = r"[^/.][^/]*(?:/[^/.][^/]*)*"
            out += f"(?:/{below})?" if index else below
        else:
            out += slash + r"(?:[^/.][^/]*/)*"
            slash = ""
    return out


def _component(part: str) -> str:
    """One path component's pattern as a regex: no ``/``, no leading dot for a wildcard."""
    out = []
    i = 0
    while i < len(part):
        char = part[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = part.find("]", i + 2)
            if end < 0:
                out.append(re.escape(char))
            else:
                inner = part[i + 1:end]
                if inner.startswith("!"):
                    inner = "^" + inner[1:]
                out.append("[" + inner.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    regex = "".join(out)
    return regex if part.startswith(".") or not glob.has_magic(part[:1]) else "(?!\\.)" + regex
