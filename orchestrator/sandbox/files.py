"""Small file helpers the sandbox's parts share: atomic writes and the stand-ins' sh wrappers."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
STANDIN_DIR = PACKAGE_DIR / "bin"


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename, so no reader sees half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sh_wrapper(path: Path, argv: list[str], env: dict[str, str] | None = None) -> None:
    """``path``: a two-line sh script that execs ``argv`` with the caller's arguments appended.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "w"
    >>> sh_wrapper(p, ["/usr/bin/python3", "-E", "it's"], {"A": "1"})
    >>> print(p.read_text(), end="")
    #!/bin/sh
    A=1 exec /usr/bin/python3 -E 'it'"'"'s' "$@"
    """
    assigns = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    words = " ".join(shlex.quote(a) for a in argv)
    write_atomic(path, f'#!/bin/sh\n{assigns}exec {words} "$@"\n', 0o755)


def standin_wrapper(path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> None:
    """A wrapper that runs stand-in ``script`` (orchestrator/sandbox/bin) with this Python.

    No exec bit or PATH python needed: ``python -E -S script args... "$@"``.
    """
    sh_wrapper(path, [sys.executable, "-E", "-S", str(STANDIN_DIR / script), *args], env)


def python_link(directory: Path) -> None:
    """``directory/python3``: this machine's interpreter itself, as a host's ``/usr/bin/python3``.

    ``python3`` on this machine's PATH may be a pyenv shim (a bash script, ~0.5 s a
    call); a Proxmox host or container starts its interpreter directly. A symlink to
    the real binary, except in a virtualenv, whose packages only its own ``python``
    finds: then a one-line sh wrapper (``exec`` costs ~1 ms).
    """
    link = directory / "python3"
    if sys.prefix != sys.base_prefix:
        sh_wrapper(link, [sys.executable])
        return
    real = os.path.realpath(sys.executable)
    if link.is_symlink() and os.readlink(link) == real:
        return
    tmp = directory / f".python3.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(real)
    os.replace(tmp, link)


def rmdir_cgroup(path: Path, deadline: float) -> bool:
    """rmdir the cgroup ``path``, SIGKILLing what is still in it, until monotonic ``deadline``.

    The caller owns the cgroup, so a process left in it is its own: killed, and the rmdir
    retried while it exits (EBUSY). True when it is gone (or never was).
    """
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("cgroup %s not removed: %s", path, exc)
                return False
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
