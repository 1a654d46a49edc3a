"""What a one-shot command imports (not how long it takes: that depends on the machine).

``orch check`` runs from cron on every target of a fleet: each module it imports is CPU on the
operator's machine every time (docs/ARCHITECTURE.md, "Performance"). These tests run the real
command in a fresh interpreter and read ``sys.modules`` afterwards: a module imported at the
top of something on the check path, when only another command needs it, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_ON_THE_CHECK_PATH = (
    "rich",  # check prints JSON or plain lines; rich is for tables, help and the dashboard
    "rich.console",
    "torch",
    "trainer",
    "libtmux",
    "orchestrator.views.watch",
    "orchestrator.views.watch_loop",
    "orchestrator.commands.watching",
    "orchestrator.lifecycle.launch",
    "orchestrator.postmortem",
    "orchestrator.heal.healer",
    "orchestrator.sandbox",
    "urllib.request",  # alerts post only when there is something to deliver
    "http.client",
    "typer",  # check's plain argv is parsed without typer (commands/fastcheck.py)
    "click",
    "pydantic",
    "importlib.metadata",  # paramiko's __version__ without it (transport/sshlib.py)
)


def modules_after(argv: list[str], tmp_path: Path) -> set[str]:
    """``sys.modules`` after ``orch ARGV`` ran in a fresh interpreter (its exit code ignored)."""
    code = (
        "import json, sys\n"
        "from orchestrator.cli import run\n"
        f"code = run({argv!r})\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ORCH_DB": str(tmp_path / "orch.db"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("MODULES ")]
    assert lines, res.stderr[-3000:]
    return set(json.loads(lines[-1][8:]))


@pytest.mark.parametrize("plain", [False, True], ids=["json", "plain"])
def test_check_imports_nothing_it_does_not_use(tmp_path: Path, plain: bool) -> None:
    config = tmp_path / "hosts.yaml"
    config.write_text(
        "hosts:\n  pve1: {address: 127.0.0.1, port: 9}\n"
        "containers:\n  ct1: {host: pve1, vmid: 101}\n"
    )
    argv = ["-c", str(config), "check", "--timeout", "1"] + ([] if plain else ["--json"])
    mods = modules_after(argv, tmp_path)
    assert "orchestrator.monitor.sweep" in mods  # the check did run
    assert "orchestrator.detect.engine" in mods
    loaded = sorted(m for m in NOT_ON_THE_CHECK_PATH if m in mods)
    assert loaded == [], f"orch check imported {loaded}"


def test_importing_the_cli_loads_no_command_body(tmp_path: Path) -> None:
    """``orch --version`` (and every command) pays only for the command modules' registrations."""
    mods = modules_after(["--version"], tmp_path)
    heavy = {"orchestrator.monitor.sweep", "orchestrator.playbooks.loader", "paramiko", "yaml"}
    assert sorted(heavy & mods) == [] and "rich.console" not in mods
