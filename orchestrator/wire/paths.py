"""Where orch keeps its own files, and how it writes them privately.

Everything orch stores on the operator's machine (the history database, postmortem
bundles, sandbox state, local run dirs) lives under :func:`state_dir`. Files that may
hold hostnames, commands or evidence are written with :func:`write_private` (0600,
atomic) into directories made with :func:`ensure_private_dir` (0700).

Use these instead of a local ``_write_atomic``: one place decides the modes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def state_dir() -> Path:
    """orch's state directory: ``$ORCH_STATE_DIR``, else ``$XDG_STATE_HOME/orch``, else
    ``~/.local/state/orch``. Only computed (never created; see :func:`ensure_private_dir`).

    >>> import os
    >>> os.environ["ORCH_STATE_DIR"] = "/tmp/orch-state"
    >>> str(state_dir())
    '/tmp/orch-state'
    >>> del os.environ["ORCH_STATE_DIR"]
    """
    explicit = os.environ.get("ORCH_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path("~/.local/state").expanduser()
    return base / "orch"


def writable_by_others(mode: int) -> bool:
    """Whether a ``st_mode`` lets group or others write (a sticky directory does not count:
    others cannot replace what you own in it, as in ``/tmp``).

    >>> writable_by_others(0o100644), writable_by_others(0o100664), writable_by_others(0o40777)
    (False, True, True)
    >>> writable_by_others(0o41777)
    False
    """
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return False
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def readable_by_others(mode: int) -> bool:
    """Whether a ``st_mode`` lets group or others read (a private key must not).

    >>> readable_by_others(0o100600), readable_by_others(0o100640), readable_by_others(0o100604)
    (False, True, True)
    """
    return bool(mode & (stat.S_IRGRP | stat.S_IROTH))


def ensure_private_dir(path: Path | str) -> Path:
    """Create ``path`` (and missing parents) as a 0700 directory; return it.

    A directory that already exists is tightened to 0700 when group or others can
    write it (orch owns its state directories). Parents that had to be created get
    0700 too.

    Raises:
        OSError: it cannot be created, or exists and is not a directory.
    """
    path = Path(path).expanduser()
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a concurrent creator is fine
            directory.mkdir(mode=PRIVATE_DIR_MODE)
        os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} exists and is not a directory")
    if writable_by_others(st.st_mode) and st.st_uid == os.getuid():
        log.info("%s was writable by group or others; tightened to 0700", path)
        os.chmod(path, PRIVATE_DIR_MODE)
    return path


def write_private(path: Path | str, data: bytes | str, mode: int = PRIVATE_FILE_MODE) -> Path:
    """Write ``data`` to ``path`` atomically with ``mode`` (default 0600); return the path.

    The bytes go to a temp file beside ``path`` (created 0600, so never readable by
    others, not even for a moment), are fsynced, then renamed over ``path``: readers
    see the old file or the new one, never half of it. A missing parent directory is
    created 0700. ``str`` data is written as UTF-8.

    Raises:
        OSError: the directory is not writable or the disk is full (the temp file is removed).
    """
    path = Path(path).expanduser()
    if not path.parent.exists():
        ensure_private_dir(path.parent)
    return atomic_write(path, data, mode)


def atomic_write(
    path: Path | str,
    data: bytes | str,
    mode: int = 0o644,
    *,
    suffix: str = ".tmp",
    fsync: bool = True,
) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` through a temp file beside it, then rename;
    return the path. The one atomic write of orch, the agent's included (this module ships in
    its bundle: standard library only).

    The temp file (``.<name>.<random><suffix>``) is created 0600, gets ``mode`` only once
    complete, and (with ``fsync``) is flushed to disk before the rename, so readers see the
    old file or the new one, never half of it. The parent directory must exist.

    Raises:
        OSError: the directory is missing or not writable, or the disk is full (the temp
            file is removed).
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def mode_if_writable_by_others(path: Path | str) -> int | None:
    """``path``'s ``st_mode`` when group or others can write it (see :func:`writable_by_others`);
    ``None`` when they cannot or ``path`` cannot be stat'ed. Never raises.

    >>> mode_if_writable_by_others("/nonexistent/orch") is None
    True
    """
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return None
    return mode if writable_by_others(mode) else None


def warn_if_writable_by_others(path: Path | str, what: str) -> bool:
    """Log a warning (and return True) when ``path`` exists and group or others can write it.

    ``what`` names it in the message (``"state directory"``). Never raises.
    """
    path = Path(path)
    mode = mode_if_writable_by_others(path)
    if mode is None:
        return False
    log.warning(
        "%s %s is writable by group or others (mode %03o): whoever can write it can change "
        "what orch records and runs; run: chmod go-w %s",
        what,
        path,
        stat.S_IMODE(mode),
        path,
    )
    return True
