"""A cache of the parsed playbooks, so a one-shot command does not parse YAML per process.

Parsing the bundled set (37 YAML files through the node reader, ~700 regexes validated, the
literal needles of each worked out with ``re``'s own parser, the vocabulary tables) cost
~220 ms of CPU in every ``orch check``; reading it back from here costs ~5 ms
(:func:`key_of` reads and hashes the files, then one unpickle).

What is stored: the validated :class:`~orchestrator.playbooks.loader.Playbook` list as a
pickle, *without* compiled regexes, and the text of the matcher's prefilter trie (building it
took ~12 ms; compiling it, ~10-20 ms, is still paid per process). Measured on the bundled set (``/tmp`` scripts, 2 cores):
unpickling a list whose signatures hold ``re.Pattern`` objects recompiles each of them
(~60 ms, most of what parsing cost); JSON of the same structure needs a Python-level
rebuild of every dataclass and was slower to load than pickle. So signatures compile
their regexes on first use (:func:`~orchestrator.playbooks.matching.compile_once`),
and a healthy log line never needs one: the matcher's prefilter rejects it first.

The key (:func:`key_of`) is a hash of orch's version, the Python version, the source of the
modules that parse playbooks, and the name and bytes of every file the loader reads
(``*.yaml`` and ``vocab/*.tsv`` of the directory): editing any playbook, a user's
directory (``--playbooks DIR``) or the parser itself gives a new key. Each directory has
its own file (named by a hash of its resolved path) under :func:`cache_dir`.

Never an error for the user: a cache that is missing, unreadable, corrupt, from another
key or not writable is ignored (logged at debug) and the playbooks are parsed as before.
Writes go to a temporary file in the same folder, then ``os.replace``: a reader sees the
old file or the new one, never half of one. The file is the user's own (mode 0600 in the
user's cache dir), the same trust as the playbooks it was built from.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.playbooks.vocab import VOCAB_DIR

log = logging.getLogger(__name__)

FORMAT = 1
"""Bumped when what is stored changes shape (also part of the key)."""
_CODE = ("loader.py", "matching.py", "prefilter.py", "steps.py", "terminal.py", "vocab.py")
"""The modules whose code decides what a parsed playbook is: their source is in the key."""
_HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/orch``, else ``~/.cache/orch`` (as the state dir reads
    ``$XDG_STATE_HOME``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "orch"


def playbook_files(root: Path) -> list[Path]:
    """Every file the loader reads from ``root``, in a fixed order."""
    return sorted(root.glob("*.yaml")) + sorted((root / VOCAB_DIR).glob("*.tsv"))


def key_of(root: Path, files: list[tuple[Path, bytes]], variant: str = "") -> str:
    """The cache key of ``files`` (``(path, bytes)`` as read) of the directory ``root``.

    >>> k = key_of(Path("/p"), [(Path("/p/a.yaml"), b"id: a")])
    >>> k == key_of(Path("/p"), [(Path("/p/a.yaml"), b"id: b")])
    False
    """
    h = hashlib.sha256()
    for part in (str(FORMAT), __version__, sys.version, variant, str(root)):
        h.update(part.encode() + b"\0")
    for name in _CODE:
        try:
            h.update((_HERE / name).read_bytes())
        except OSError:
            h.update(b"?")
    for path, data in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def path_for(root: Path) -> Path:
    """The cache file of the playbook directory ``root``."""
    tag = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / f"playbooks-{tag}.pickle"


def load(root: Path, key: str) -> Any | None:
    """What :func:`store` kept for ``root`` under ``key``; ``None`` when absent, stale or
    unreadable (any failure: the caller parses instead)."""
    path = path_for(root)
    try:
        with path.open("rb") as fh:
            stored_key, payload = pickle.load(fh)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a corrupt cache is rebuilt, never an error
        log.debug("playbook cache %s unreadable (%s: %s); rebuilt", path, type(exc).__name__, exc)
        return None
    if stored_key != key:
        log.debug("playbook cache %s is stale; rebuilt", path)
        return None
    return payload


def store(root: Path, key: str, payload: Any) -> None:
    """Keep ``payload`` for ``root`` under ``key``, atomically; failures are logged and ignored."""
    path = path_for(root)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".playbooks-", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "wb") as fh:
            pickle.dump((key, payload), fh, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
        tmp = None
    except Exception as exc:  # noqa: BLE001 - no cache is slower, never wrong
        log.debug("playbook cache %s not written (%s: %s)", path, type(exc).__name__, exc)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
