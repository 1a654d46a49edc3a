"""What one ``orch check`` costs the fleet: remote processes per target, the interpreter used.

Counted on the sandbox's real sshd (its log has one ``Starting session`` line per
command), with ``orch check`` as a fresh process each time, so nothing is cached
between checks as nothing would be between two cron runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e]


def sessions(fleet) -> int:
    log = Path(fleet.state_dir) / "sshd" / "sshd.log"
    return log.read_text(errors="replace").count("Starting session: command")


def _check(fleet, config: Path, db: Path) -> dict:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "check",
            "--json",
            "--db",
            str(db),
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    doc = json.loads(res.stdout)
    assert doc["status"] != "UNKNOWN", res.stderr[-2000:]
    return doc


def test_a_warm_check_is_one_remote_command_per_host(fleet, tmp_path):
    """Observed from the host, the whole host is ONE command: its observer."""
    if fleet.info.isolation != "lxc":
        pytest.skip("process-mode containers are observed from inside")
    db = tmp_path / "orch.db"
    _check(fleet, Path(fleet.config), db)
    before = sessions(fleet)
    doc = _check(fleet, Path(fleet.config), db)
    assert all(t["reachable"] and t["observed_from"] == "host" for t in doc["targets"]), doc
    assert sessions(fleet) - before == 1


def test_a_warm_check_from_inside_is_one_remote_command_per_target_and_per_host(fleet, tmp_path):
    """``observe: container``: one ``pct exec`` per container plus the host probe."""
    config = tmp_path / "hosts.yaml"
    doc = yaml.safe_load(Path(fleet.config).read_text())
    for h in doc["hosts"].values():
        h["observe"] = "container"
    config.write_text(yaml.safe_dump(doc))
    db = tmp_path / "orch.db"
    _check(fleet, config, db)
    before = sessions(fleet)
    doc = _check(fleet, config, db)
    assert all(t["reachable"] and t["observed_from"] == "container" for t in doc["targets"]), doc
    # 2 containers + 1 host probe: the agent runs straight from its bundle, no deploy check
    assert sessions(fleet) - before == len(doc["targets"]) + 1


def test_the_fleet_runs_the_real_interpreter_not_a_shim(fleet):
    """python3 on this machine may be a pyenv shim (bash, ~0.5 s a call); hosts have the binary."""
    real = os.path.realpath(sys.executable)
    if sys.prefix != sys.base_prefix:
        pytest.skip("in a virtualenv the sandbox's python3 is an exec wrapper")
    dirs = [Path(fleet.state_dir) / "bin"]
    if fleet.info.isolation == "process":  # an LXC container runs the operator's python by path
        dirs.append(fleet.info.container_root(200) / "usr" / "bin")
    for d in dirs:
        assert os.path.realpath(d / "python3") == real
