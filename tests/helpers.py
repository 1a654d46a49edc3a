"""Small generic test helpers shared by every test area."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# how test sandboxes isolate their containers: auto (LXC where it can run, as CI), lxc, process
SANDBOX_ISOLATION = os.environ.get("ORCH_TEST_ISOLATION", "auto")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Raises:
        AssertionError: after ``timeout_s`` seconds, naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (bind to 0, read it back, close)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


OLD_PYTHON = r"""#!/bin/bash
# python3 as Debian 11, Ubuntu 20.04 and Proxmox VE 7 ship it, for every version check orch
# makes (`--version`, sys.version_info in a -c script): 3.9.2. It runs the real __REAL__.
if [[ $1 == --version || $1 == -V ]]; then echo "Python 3.9.2"; exit 0; fi
opts=()
while [[ $1 == -* && $1 != -c ]]; do opts+=("$1"); shift; done
if [[ $1 == -c ]]; then
  code=$2
  shift 2
  exec __REAL__ "${opts[@]}" -c 'import sys
sys.version_info, sys.version = (3, 9, 2, "final", 0), "3.9.2 (default, Feb 28 2021)"
exec(compile(sys.argv.pop(1), "<string>", "exec"))' "$code" "$@"
fi
exec __REAL__ "${opts[@]}" "$@"
"""


def old_python(sandbox: Any, container: str, real: str) -> str:
    """Put a ``python3`` that says it is 3.9.2 (:data:`OLD_PYTHON`, running ``real``) into a
    sandbox container, beside its workdir; its path as hosts.yaml's ``python:`` names it."""
    host_dir = Path(sandbox.workdir(container)).parent / "old-python"
    host_dir.mkdir(exist_ok=True)
    script = host_dir / "python3"
    script.write_text(OLD_PYTHON.replace("__REAL__", shlex.quote(real)))
    script.chmod(0o755)
    return str(Path(sandbox.container_workdir(container)).parent / "old-python" / "python3")


def cli_in_process(config: Path, capsys: Any) -> Callable[..., tuple[int, str, str]]:
    """``orch -c CONFIG ARGS`` in this process: a function returning (exit code, stdout,
    stderr); ``capsys`` is pytest's fixture, emptied before each call."""
    from orchestrator.cli import run

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(["-c", str(config), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return call


STAND_IN = "TRAINER_STAND_IN"
"""The environment variable that runs trainer/standin.py in place of the bundled trainer."""


def stand_in_env(container: dict[str, Any]) -> dict[str, str]:
    """A sandbox container's hosts.yaml ``env`` plus ``TRAINER_STAND_IN=1``: ``python -m
    trainer`` there is the torch-free stand-in (same flags, lines, files, faults, exit codes;
    docs/trainer.md), for tests that need only the trainer's behaviour. Pass it as
    ``sandbox_config(..., env=stand_in_env)``. ``ORCH_TEST_TRAINER=real`` in the tests'
    environment leaves the stand-in out: every such test runs the real trainer again."""
    env = dict(container.get("env") or {})
    if os.environ.get("ORCH_TEST_TRAINER") != "real":
        env[STAND_IN] = "1"
    return env
