"""What zephon reads back that it wrote: one rule and one reader for every artifact.

Loader-state entries, saved plans, Hub listings and shard-cache records leave the process and
come back through files, checkpoints and other nodes. None is believed as written. The rule
for all of them:

- **Plain data only**: dicts with string keys, lists, strings, numbers, booleans and None
  (token arrays as base64 text, unit tables as raw little-endian columns). Nothing read back
  is ever unpickled or otherwise executed.
- **Sealed**: every artifact is a dict that names its kind (``"artifact"``) and carries the
  SHA-256 of its canonical JSON (``"sha256"``: sorted keys, no spaces, ASCII) over all its
  other fields. A binary artifact seals a JSON header that holds the SHA-256 of its body.
- **One reader**: :func:`opened` checks the kind and the checksum, and then the caller's
  schema, written with :mod:`zephon.field_checks` (every field against what it must be:
  types, ranges, ids within the vocabulary, units within their file). Any misfit is an
  :class:`ArtifactError` naming the artifact (its file or key) and the field.

The checksum catches damage and edits; it is not a signature (whoever can write the artifact
can seal it again), which is why every value is still checked against what it must be.
Cost: the canonical JSON of a lane entry is about 1.4 bytes a token it holds (base64), hashed
at some GB/s: well under a millisecond for a typical entry, once per checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from zephon.errors import DataError, StateMismatchError
from zephon.field_checks import StateFieldError, describe, need_dict, need_str

T = TypeVar("T")

KIND = "artifact"
"""The field naming an artifact's kind."""
CHECKSUM = "sha256"
"""The field holding an artifact's checksum."""


class ArtifactError(StateMismatchError, DataError):
    """An artifact read back is damaged, of another kind, or holds a value it cannot hold;
    the message names the artifact and the field. A StateMismatchError (what a resume
    catches) and a DataError (what a reader catches)."""


def canonical(value: Any) -> bytes:
    """``value``'s canonical JSON: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode("ascii")


def digest(value: Any) -> str:
    """The SHA-256 (hex) of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical(value)).hexdigest()


def sealed(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as an artifact of ``kind``: with its kind and its checksum added."""
    out = {KIND: kind, **{k: v for k, v in fields.items() if k not in (KIND, CHECKSUM)}}
    out[CHECKSUM] = digest(out)
    return out


def opened(value: Any, kind: str, where: str, check: Callable[[dict[str, Any]], T]
           ) -> T:
    """``check(fields)`` of the artifact ``value`` once its kind is ``kind`` and its checksum
    matches its content; ``check`` raises :class:`~zephon.field_checks.StateFieldError` for a
    field it refuses. Everything refused is an :class:`ArtifactError` naming ``where`` (the
    artifact's file or key) and the field."""
    try:
        fields = need_dict(value, "")
        found = fields.get(KIND)
        if found != kind:
            raise StateFieldError(KIND, f"is {describe(found)}, expected {kind!r} (this is "
                                        "not that artifact)")
        stored = need_str(fields.get(CHECKSUM), CHECKSUM)
        content = {k: v for k, v in fields.items() if k != CHECKSUM}
        try:
            actual = digest(content)
        except (TypeError, ValueError) as exc:
            raise StateFieldError("", f"is not plain data ({exc})") from None
        if actual != stored:
            raise StateFieldError(CHECKSUM, f"is {stored[:16]}..., but the content hashes to "
                                            f"{actual[:16]}...: the artifact was changed or "
                                            "damaged after it was written")
        return check({k: v for k, v in content.items() if k != KIND})
    except StateFieldError as exc:
        raise ArtifactError(f"{where}: {exc}" if exc.path else f"{where} {exc}") from None


def as_text(value: Any) -> str:
    """``value`` (plain data) as JSON text: what a checkpointer that stores opaque values
    (TorchTitan's DCP) keeps of a lane entry."""
    return json.dumps(value, sort_keys=True)


def from_text(value: Any, where: str) -> Any:
    """A value stored by :func:`as_text` (JSON as text or bytes) decoded; plain data (a
    dict, ...) passes as it is. Pickled bytes are refused, never loaded: unpickling runs
    whatever code the bytes name."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if data[:1] == b"\x80":
            raise ArtifactError(f"{where} is pickled bytes (written by zephon 0.2, or not by "
                                "zephon); zephon reads loader states as plain data only and "
                                "never unpickles them: start the data over (TorchTitan: "
                                "--checkpoint.exclude_from_loading dataloader)")
        value = data.decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ArtifactError(f"{where} is text that is not JSON ({exc})") from None
    return value


def dump(kind: str, fields: dict[str, Any]) -> bytes:
    """The bytes of a sealed JSON artifact."""
    return json.dumps(sealed(kind, fields), sort_keys=True).encode()


def load(data: bytes | str, kind: str, where: str, check: Callable[[dict[str, Any]], T]
         ) -> T:
    """:func:`opened` of the JSON artifact ``data``; text that is not JSON is an
    :class:`ArtifactError` naming ``where``."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{where}: not a zephon {kind} (not JSON: {exc})") from None
    return opened(value, kind, where, check)


def write(path: str | os.PathLike[str], kind: str, fields: dict[str, Any]) -> None:
    """Write a sealed JSON artifact to ``path`` atomically (a partial file is never left
    under that name)."""
    target = Path(path)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    partial.write_bytes(dump(kind, fields))
    os.replace(partial, target)


def read(path: str | os.PathLike[str], kind: str, check: Callable[[dict[str, Any]], T]) -> T:
    """:func:`load` of the file ``path``, named in every error."""
    return load(Path(path).read_bytes(), kind, str(path), check)
