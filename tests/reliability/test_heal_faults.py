"""Self-healing under faults of its own: the supervisor killed (SIGKILL) mid-backoff and
started again, and two supervisors on one container. The restart budget and the claim live in
the history database (SQLite, with the check's lock), so neither may restart a run twice.

The run is a custom command that exits 3 at step 4 of its first life and runs on forever once
relaunched (the relaunch sets ``ORCH_RESUME=auto``, the custom-command half of ``resume: auto``);
nothing explains exit 3, so the policy says ``retry_unknown: true``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.monitor.history import History
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CMD = (
    'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500"; sleep 0.5; '
    '[ -z "$ORCH_RESUME" ] && [ "$i" -ge 4 ] && exit 3; done'
)
BACKOFF_S = 6.0
INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def heal_config(fleet) -> Path:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(fleet.config.read_text())
    # the tuned 3 s startup timeout is shorter than launch's 5 s proof of life (VERIFY_MIN_ALIVE_S)
    doc["defaults"]["thresholds"]["startup_timeout_s"] = 30
    doc["defaults"]["restart"] = {
        "max": 3,
        "window": "1h",
        "backoff": [BACKOFF_S],
        "retry_unknown": True,
        "settle_timeout": "60s",
    }
    path = fleet.state_dir / "heal.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _supervise(config: Path, db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "supervise",
            "ct200",
            "--db",
            str(db),
            "--interval",
            str(INTERVAL_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


def _journal(db: Path, config: Path) -> list:  # type: ignore[type-arg]
    from orchestrator.config.inventory import load_inventory

    if not db.exists():
        return []
    with History.open(db, inventory=load_inventory(config)) as h:  # its rows: keyed by identity
        return h.journal("ct200")


def _first_run(fleet) -> str:  # type: ignore[no-untyped-def]
    fleet.start_container("ct200")
    fleet.scenario("idle")
    run_id = fleet.agent_launch("ct200", cmd=CMD)
    wait_for(
        lambda: (fleet.run_dir("ct200") / "exit_status").exists(),
        30,
        what="the first run to exit 3",
    )
    return run_id


def _runs(fleet) -> list[str]:  # type: ignore[no-untyped-def]
    root = fleet.info.workdir("ct200") / "runs"
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _stop(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    return out


@pytest.mark.fault(
    area="self-healing",
    fault="`orch supervise` SIGKILLed mid-backoff, then started again",
    must="the new supervisor keeps the journaled due time (death first seen + backoff) and "
    "restarts once: never a second restart, never before the backoff",
)
def test_supervisor_killed_mid_backoff_restarts_once(fleet, heal_config, observe, tmp_path):
    db = tmp_path / "orch.db"
    old = _first_run(fleet)
    a = _supervise(heal_config, db)
    wait_for(
        lambda: [e.action for e in _journal(db, heal_config)] == ["wait"], 60, 0.1, what="A's wait"
    )
    wait = _journal(db, heal_config)[0]
    time.sleep(1.0)
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    killed_at = time.time()
    b = _supervise(heal_config, db)
    try:
        wait_for(
            lambda: (
                {"restarted", "restart-failed", "give-up"}
                & {e.action for e in _journal(db, heal_config)}
            ),
            90,
            0.1,
            what="B's restart",
        )
        time.sleep(3 * INTERVAL_S)
    finally:
        out_b = _stop(b)
    journal = _journal(db, heal_config)
    restarts = [e for e in journal if e.action == "restart"]
    new = [r for r in _runs(fleet) if r > old]
    observe(
        f"A killed {killed_at - wait.at:.1f} s into a {BACKOFF_S:g} s backoff (due "
        f"{wait.due_at - wait.at:.1f} s after first sight); B claimed the restart "
        f"{restarts[0].at - wait.due_at:+.1f} s from that due time; journal "
        f"{[e.action for e in journal]}; new runs {len(new)}"
    )
    assert len(restarts) == 1 and restarts[0].by != wait.by, out_b
    assert restarts[0].at >= wait.due_at, "never before the backoff"
    assert restarts[0].at - wait.due_at < 10.0, "B took the due time over, not a fresh backoff"
    assert len(new) == 1 and journal[-1].new_run_id == new[0]
    assert [e.action for e in journal].count("wait") == 1, "the wait is journaled once"


@pytest.mark.fault(
    area="self-healing",
    fault="two `orch supervise` processes on one container and one history database",
    must="exactly one of them restarts the dead run (the claim is journaled under the check's "
    "lock; the unit's restart lock is held until the outcome); one new run",
)
def test_two_supervisors_restart_once(fleet, heal_config, observe, tmp_path):
    db = tmp_path / "orch.db"
    old = _first_run(fleet)
    procs = [_supervise(heal_config, db), _supervise(heal_config, db)]
    try:
        wait_for(
            lambda: "restarted" in [e.action for e in _journal(db, heal_config)],
            90,
            0.1,
            what="a restart",
        )
        time.sleep(6 * INTERVAL_S)  # both go on looking at the new run
    finally:
        outs = [_stop(p) for p in procs]
    journal = _journal(db, heal_config)
    claims = [e for e in journal if e.action == "restart"]
    pids = [p.pid for p in procs]
    who = [next((i for i, pid in enumerate(pids) if f"pid {pid} " in e.by), -1) for e in journal]
    new = [r for r in _runs(fleet) if r > old]
    observe(
        f"journal {[f'{e.action}@{chr(65 + w)}' for e, w in zip(journal, who, strict=True)]}; "
        f"restart claims {len(claims)}; new runs {len(new)}"
    )
    assert len(claims) == 1 and len(new) == 1, (outs, [e.line() for e in journal])
    assert journal[-1].action == "restarted" and journal[-1].new_run_id == new[0]
    claimed = [sum(line.startswith("ct200 restart ") for line in o.splitlines()) for o in outs]
    assert sorted(claimed) == [0, 1], claimed  # one process printed the claim, the other none
    assert os.path.exists(fleet.info.workdir("ct200") / "runs" / new[0] / "manifest.json")
