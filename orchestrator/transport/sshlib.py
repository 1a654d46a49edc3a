"""paramiko, imported once for every module of transport/, without ``invoke``.

paramiko.config imports ``invoke`` (when it is installed) for ``Match exec`` in paramiko's
own ssh_config reader (paramiko 3.x ``paramiko/config.py``), which orch never uses: orch
reads ~/.ssh/config itself (:mod:`orchestrator.transport.openssh_config`). invoke brings
asyncio and unittest.mock with it: ~50 ms of CPU that every one-shot ``orch check`` paid
(``python -X importtime``). So it is hidden while paramiko loads; a process that imported
invoke already keeps it, and nothing of it stays hidden afterwards.
"""

from __future__ import annotations

import sys
from types import ModuleType


def load() -> ModuleType:
    """The paramiko module (imported with ``invoke`` hidden the first time)."""
    hide = "invoke" not in sys.modules
    if hide:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails
    try:
        import paramiko as mod
    finally:
        if hide and "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
    return mod


load()
import paramiko  # noqa: E402 - loaded just above, without invoke

__all__ = ["paramiko"]
