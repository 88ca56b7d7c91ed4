"""Names from elsewhere (object keys, file names, what a cache record says), shown safely."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character that is not printable (newlines, escape sequences, other
    control and format characters) and the backslash written as a Python escape, so that a
    name prints on one line and cannot move the cursor or recolour a terminal."""
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode()
                   for c in text)
