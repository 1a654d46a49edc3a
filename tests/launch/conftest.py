"""Fixtures for the launch tests: a private tmux server and a way to run agent commands.

The agent commands run as a real subprocess (as they do in a container), with
``TMUX_TMPDIR`` pointing at a temporary directory so the tests' tmux server is
their own and is killed at teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Dispatch through runs.register() and evidence.register() alone, so these tests do not depend
# on the agent's __main__.
_DISPATCH = (
    "import argparse, sys\n"
    "from orchestrator.agent import evidence, runs\n"
    "p = argparse.ArgumentParser(prog='agent')\n"
    "sub = p.add_subparsers(dest='command', required=True)\n"
    "runs.register(sub)\n"
    "evidence.register(sub)\n"
    "a = p.parse_args()\n"
    "sys.exit(a.func(a))\n"
)


@dataclass
class LocalAgent:
    """Runs agent lifecycle commands on this machine against a private tmux server."""

    env: dict[str, str]
    workdir: Path

    def __call__(
        self, *argv: str, timeout_s: float = 60.0, stdin: str | None = None
    ) -> tuple[int, dict]:
        res = self.raw(*argv, timeout_s=timeout_s, stdin=stdin)
        lines = [line for line in res.stdout.splitlines() if line.strip()]
        assert lines, f"agent printed nothing (rc {res.returncode}); stderr: {res.stderr}"
        return res.returncode, json.loads(lines[-1])

    def raw(
        self, *argv: str, timeout_s: float = 60.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the agent; ``stdin`` is its input (``launch --env-stdin``'s document)."""
        return subprocess.run(
            [sys.executable, "-c", _DISPATCH, *argv],
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout_s,
            check=False,
        )

    def tmux(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", *argv], capture_output=True, text=True, env=self.env, timeout=10, check=False
        )


@pytest.fixture
def local_agent(tmp_path: Path) -> Iterator[LocalAgent]:
    sock = tmp_path / "tmux"
    sock.mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env["TMUX_TMPDIR"] = str(sock)
    env["PYTHONPATH"] = str(REPO)
    agent = LocalAgent(env=env, workdir=workdir)
    yield agent
    agent.tmux("kill-server")
