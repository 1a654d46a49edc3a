"""Fixtures shared by every test area (small, additive; one section per owner)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# --- sandbox ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running sandbox for the whole session: 3 containers (ct200-ct202), 8 GPUs, healthy.

    Yields ``orchestrator.sandbox.manager.SandboxInfo`` (``config_path`` is its hosts.yaml);
    tears everything down (sshd, container processes, tmux servers) at the end.
    Skips when tmux, sshd or a C compiler is missing (the message names the apt package).
    """
    from orchestrator.sandbox import manager
    from orchestrator.sandbox.fakenvml import MissingTool

    state_dir: Path = tmp_path_factory.mktemp("sandbox")
    try:
        info = manager.up(state_dir, containers=3, gpus=8, scenario="healthy")
    except MissingTool as exc:
        pytest.skip(str(exc))
    try:
        yield info
    finally:
        manager.down(state_dir)


@pytest.fixture
def sandbox_scenario(sandbox: object) -> Iterator[Callable[[object], str]]:
    """A function that switches the session sandbox's scenario; ``healthy`` is restored afterwards."""
    from orchestrator.sandbox import manager

    state_dir = sandbox.state_dir  # type: ignore[attr-defined]
    yield lambda scenario: manager.set_scenario(state_dir, scenario)  # type: ignore[arg-type]
    manager.set_scenario(state_dir, "healthy")
