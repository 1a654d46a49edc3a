"""``orch stop``: SIGINT, SIGTERM at half the grace, SIGKILL at the grace; the session and the
run directory stay (the agent's ``stop`` does the signalling)."""

from __future__ import annotations

from orchestrator.config.inventory import Inventory
from orchestrator.errors import (
    AgentError,
    AgentRefused,
)
from orchestrator.remote.target import Target
from orchestrator.wire.answers import StopAnswer
from orchestrator.wire.requests import StopRequest

NEVER_RAN = "no-run"
"""``StopAnswer.state`` of a container whose workdir holds no run at all."""


def operator() -> str:
    """``user@host`` of whoever runs orch here (for ``stop_requested``); never raises."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def stop(
    inventory: Inventory,
    name: str,
    *,
    grace_s: float = 60.0,
    run_id: str | None = None,
    target: Target | None = None,
    by: str | None = None,
) -> StopAnswer:
    """SIGINT, SIGTERM at half the grace, SIGKILL at ``grace_s``; idempotent. Session and run stay.

    The agent first writes ``stop_requested`` in the run directory (time, signal,
    ``by``, default ``orch stop by user@host``): the end reads as a stop, not a crash.
    """
    tgt = target or Target(inventory, name)
    req = StopRequest(
        tgt.container.workdir,
        run_id=run_id or None,
        grace_s=grace_s,
        by=by or f"orch stop by {operator()}",
    )
    try:
        return tgt.call(req, timeout=grace_s + 30.0)
    except AgentRefused as exc:
        if exc.kind == "no-run" and not run_id:
            # nothing ever ran there: nothing to stop, as for a run that already ended
            return StopAnswer(stopped=False, run_id="", state=NEVER_RAN)
        raise AgentError(f"{name}: stop: {exc.said}") from None
