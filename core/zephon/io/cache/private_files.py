"""Files inside the shard cache's root: private folders, no link followed, and write failures
reported as Zephon errors that name the path and what to do.

Folders. The root and its sub-folders are created by ``os.mkdir(path, 0o700)`` (the umask can
only remove bits, so no moment exists when another user may enter), never chmod-ed afterwards.
An existing folder is used only when it is a real directory owned by the effective user and not
writable by group or others; anything else is refused with :class:`ConfigError`, since whoever
can write a folder can plant links or files in it. The root itself may be a symbolic link when
the link belongs to the user or to the superuser (a scratch disk linked into place); its target
is checked instead. Ranks of one job run as one user, so they share a cache; a cache shared by
several users is not supported.

Files. Every open uses ``O_NOFOLLOW`` (a link at the last component fails with ``ELOOP``
instead of being followed). Fresh files (downloads, reservations, temporary copies) are made
with ``O_CREAT | O_EXCL`` and mode 0600: when something already stands at the path (the
leftover of a dead process, or a planted link) it is unlinked, which removes a link and never
its target, and the create is tried once more. A file that is replaced (``.ok`` records,
listings) is written under a fresh temporary name beside it and renamed over it: ``rename``
replaces a link, never writes through it.

Errors (:func:`reported`): ENOSPC/EDQUOT become :class:`DataError` (free space, another root,
or ``limit_bytes``); EROFS/EACCES/EPERM, ELOOP (a link) and EISDIR (a folder where a file
belongs) become :class:`ConfigError`. Any other ``OSError`` is a bug or a vanished file and
propagates unchanged.

Limits: the folders above the root are not checked. A root under a folder that another user
may rename entries of (world-writable without the sticky bit) can be swapped for another folder
of the user's between the check and a write; links are still never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from zephon.errors import ConfigError, DataError, ZephonError
from zephon.io.store_options import LIMIT_OPTION, ROOT_OPTION, default_cache_root

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_SPACE_ADVICE = (f"Free space on that disk, choose another cache {ROOT_OPTION}, or set "
                 f"{LIMIT_OPTION} below what the disk holds.")


def _default() -> str:
    try:
        return f" ({default_cache_root()})"
    except ConfigError:
        return ""


def _root_advice() -> str:
    return (f"Set the cache {ROOT_OPTION} (zephon cache --root) to a writable directory of "
            f"your own on local disk, such as the default{_default()}.")


def failure(exc: OSError, what: str, path: str | os.PathLike[str],
            space_advice: Callable[[], str] | None = None) -> ZephonError | None:
    """Our error for ``exc`` raised while writing ``what`` at ``path``; None when ``exc`` is not
    one the user can act on. ``space_advice()`` replaces the advice of a full disk."""
    where = os.fspath(path)
    if exc.errno in NO_SPACE:
        advice = space_advice() if space_advice is not None else _SPACE_ADVICE
        return DataError(f"{what} {where}: the disk is full ({exc.strerror}). {advice}")
    if exc.errno in READ_ONLY:
        return ConfigError(f"{what} {where} cannot be written ({exc.strerror}). "
                           f"{_root_advice()}")
    if exc.errno == errno.ELOOP:
        return ConfigError(f"{what} {where} is a symbolic link; the shard cache never follows "
                           f"links inside its root. Remove the link ({where}) or use a new cache "
                           "root of your own.")
    if exc.errno == errno.EISDIR:
        return ConfigError(f"{what} {where} is a folder where the shard cache keeps a file; "
                           "remove that folder.")
    return None


@contextlib.contextmanager
def reported(what: str, path: str | os.PathLike[str],
             space_advice: Callable[[], str] | None = None) -> Iterator[None]:
    """Turn the ``OSError`` of a write into our error (see :func:`failure`)."""
    try:
        yield
    except OSError as exc:
        error = failure(exc, what, path, space_advice)
        if error is None:
            raise
        raise error from None


# -- folders ---------------------------------------------------------------------------------
def private_dir(path: Path, what: str, allow_link: bool = False) -> None:
    """Create ``path`` with mode 0700 unless it exists, then :func:`check_private` it."""
    with reported(what, path), contextlib.suppress(FileExistsError):
        os.mkdir(path, DIR_MODE)
    check_private(path, what, allow_link)


def check_private(path: Path, what: str, allow_link: bool = False) -> None:
    """Refuse ``path`` unless it is a directory of the effective user that group and others
    cannot write (a link only where ``allow_link``, and only a link of the user's or root's)."""
    euid = os.geteuid()
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if not allow_link or st.st_uid not in (euid, 0):
            _refuse(path, what, f"is a symbolic link (of {_user(st.st_uid)})")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        _refuse(path, what, "is not a directory")
    if st.st_uid != euid:
        _refuse(path, what, f"belongs to {_user(st.st_uid)}, not to you ({_user(euid)})")
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002))
                           if st.st_mode & bit)
        _refuse(path, what, f"can be written by {who} (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"if it is yours alone, chmod 700 {path}")


def _refuse(path: Path, what: str, reason: str) -> None:
    raise ConfigError(
        f"{what} {path} {reason}. Another user could plant files or links in it, so the shard "
        f"cache refuses it. Use a cache root of your own: leave the cache {ROOT_OPTION} unset "
        f"for the per-user default{_default()}, or name a new directory (Zephon creates it with "
        "mode 0700).")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


# -- files -----------------------------------------------------------------------------------
def open_fresh(path: Path) -> int:
    """A new, empty file at ``path`` open for writing (mode 0600); whatever stood there is
    unlinked first. Only for paths the caller owns under a lock. Raises ``OSError``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:
        os.unlink(path)
    return os.open(path, flags, FILE_MODE)


def write_fresh(path: Path, data: bytes, what: str) -> None:
    """``data`` into a new file at ``path`` (see :func:`open_fresh`); removed again when the
    write fails."""
    with reported(what, path):
        fd = open_fresh(path)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise


def replace_file(path: Path, data: bytes, what: str) -> None:
    """``data`` into a fresh file beside ``path``, then renamed over it (never through a link);
    a reader sees the old content or the new, never a part."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    with reported(what, path):
        try:
            fd = open_fresh(tmp)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def open_read(path: Path) -> int:
    """``path`` open for reading, never through a link (``ELOOP``). Raises ``OSError``."""
    return os.open(path, os.O_RDONLY | _NOFOLLOW)


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, never read through a link. Raises ``OSError``."""
    with os.fdopen(open_read(path), "rb") as fh:
        return fh.read()
