"""Checkpoint file names and their atomic write (torch-free: :mod:`trainer.checkpoint` writes
the real trainer's state with it, :mod:`trainer.standin` its own).

``<run-dir>/checkpoints/step_NNNNNNN.pt``: written to a temp file in the same directory, fsynced,
then renamed, so a reader sees either the old set or a complete new file; the newest ``keep``
are kept.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def write_atomic(run_dir: Path, step: int, write: Callable[[BinaryIO], None], keep: int) -> Path:
    """Write completed ``step``'s file with ``write(fh)`` (temp, fsync, rename, fsync of the
    directory); then delete all but the newest ``keep``. Returns the file's path.

    Raises:
        OSError: the run directory is not writable (the temp file is removed).
    """
    cdir = checkpoint_dir(run_dir)
    cdir.mkdir(parents=True, exist_ok=True)
    final = cdir / f"step_{step:07d}.pt"
    tmp = cdir / f".{final.name}.tmp.{os.getpid()}"
    try:
        with tmp.open("wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(cdir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(run_dir)[keep:]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint files, newest step first.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> [write_atomic(d, s, lambda fh: fh.write(b"x"), keep=2).name for s in (1, 2, 3)][-1]
    'step_0000003.pt'
    >>> [p.name for p in list_checkpoints(d)]
    ['step_0000003.pt', 'step_0000002.pt']
    """
    cdir = checkpoint_dir(run_dir)
    if not cdir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in cdir.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def warn_skipped(what: str, path: Path, exc: BaseException) -> None:
    """``trainer: warning: skipping WHAT checkpoint PATH: REASON`` on stderr (the error's first
    line): ``--resume auto`` passes over a checkpoint it cannot load, never loading it."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(
        f"trainer: warning: skipping {what} checkpoint {path}: {reason}",
        file=sys.stderr,
        flush=True,
    )
