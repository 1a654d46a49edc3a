"""paramiko, imported once for every module of transport/, without ``invoke``.

paramiko.config imports ``invoke`` (when it is installed) for ``Match exec`` in paramiko's
own ssh_config reader (paramiko 3.x ``paramiko/config.py``), which orch never uses: orch
reads ~/.ssh/config itself (:mod:`orchestrator.transport.openssh_config`). invoke brings
asyncio and unittest.mock with it: ~50 ms of CPU that every one-shot ``orch check`` paid
(``python -X importtime``). So it is hidden while paramiko loads; a process that imported
invoke already keeps it, and nothing of it stays hidden afterwards.

paramiko 5's ``__init__`` also sets ``__version__ = metadata.version("paramiko")``
(``importlib.metadata``, with email, zipfile and csv: ~30 ms of CPU an ``orch check``, for
one string: the version paramiko puts in its SSH banner). While paramiko loads,
``importlib.metadata`` is a stand-in whose ``version`` reads the same ``Version:`` line of
the same ``paramiko-*.dist-info/METADATA`` the real one would find first on ``sys.path``
(:func:`_paramiko_version`; the real module when that file is not there). The stand-in is
gone when paramiko has loaded; a process that imported ``importlib.metadata`` already keeps it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

_METADATA = "importlib.metadata"


def _paramiko_version(name: str) -> str:
    """``importlib.metadata.version(name)`` for paramiko installed as a wheel (a
    ``NAME-VERSION.dist-info`` directory on ``sys.path``, as the real lookup finds it first);
    anything else asks the real ``importlib.metadata``."""
    prefix = name.lower() + "-"
    for entry in sys.path:
        try:
            found = sorted(
                d
                for d in Path(entry or ".").iterdir()
                if d.name.lower().startswith(prefix) and d.name.endswith(".dist-info")
            )
        except OSError:
            continue
        if len(found) == 1:
            try:
                with (found[0] / "METADATA").open(encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                pass
        if found:
            break
    from importlib import metadata

    return metadata.version(name)


def load() -> ModuleType:
    """The paramiko module (imported with ``invoke`` hidden and ``importlib.metadata`` stood
    in for the first time)."""
    hide = "invoke" not in sys.modules
    stand_in = _METADATA not in sys.modules
    if hide:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails
    if stand_in:
        stub = ModuleType(_METADATA)
        stub.version = _paramiko_version  # type: ignore[attr-defined]
        sys.modules[_METADATA] = stub
    try:
        import paramiko as mod
    finally:
        if hide and "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
        if stand_in and sys.modules.get(_METADATA) is stub:
            del sys.modules[_METADATA]
    return mod


load()
import paramiko  # noqa: E402 - loaded just above, without invoke

__all__ = ["paramiko"]
