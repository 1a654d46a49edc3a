"""Self-healing end to end through the sandbox (real sshd, pct stand-in, tmux, fake NVML, the
bundled trainer): ``orch supervise`` as a real process and ``orch check --heal`` in a loop.

The runs are the trainer's torch-free stand-in (``TRAINER_STAND_IN=1``, trainer/standin.py:
the same flags, lines, files, faults and exit codes) except in two tests that need the real
one: the loop of ``orch check --heal`` (a real checkpoint resumed) and seed 002's FX race
(torch's own message; the stand-in hands an ``fx-race`` run to the real trainer).

Own tmux session (``heal-e2e``), GPUs idle, small backoffs (hosts.yaml takes seconds), a
private history database per test. Notices go to a command hook that appends each delivery
(one JSON document) to a file, so "one notice", "one page" are counted, not assumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.monitor.history import History
from tests.helpers import stand_in_env, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SESSION = "heal-e2e"
POLICY = {"max": 2, "window": "1h", "backoff": [2], "retry_unknown": True, "settle_timeout": "60s"}
# crashes at step 25 of its first run only; checkpoints every 10 steps: the relaunch resumes at 20
CRASH_ONCE = (
    "--steps",
    "60",
    "--fault",
    "crash-once@25",
    "--set",
    "train.ckpt_every=10",
    "--set",
    "train.log_every=1",
)


@pytest.fixture(scope="module")
def config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """The stand-in trainer's hosts.yaml."""
    return sandbox_config(
        SESSION,
        trainer_config="tiny-cpu",
        gpus={"drafter": [6, 7]},
        restart=POLICY,
        env=stand_in_env,
    )


@pytest.fixture(scope="module")
def real_config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """The real trainer's hosts.yaml (torch, tiny-cpu)."""
    return sandbox_config(
        SESSION, trainer_config="tiny-cpu", gpus={"drafter": [6, 7]}, restart=POLICY
    )


class Heal:
    """One test's orch: its config, database, notices file and the processes it started."""

    def __init__(self, config: Path, tmp: Path, sandbox) -> None:  # type: ignore[no-untyped-def]
        self.config, self.db, self.sandbox = config, tmp / "orch.db", sandbox
        self.notices = tmp / "notices.jsonl"
        self.env = {**os.environ, "ORCH_STATE_DIR": str(tmp / "state")}
        self.procs: list[subprocess.Popen[str]] = []
        self.preflight = ""  # the last launch's preflight "ok" line
        self.hook = ["--notify-cmd", f"sh -c 'cat >> {self.notices}; echo >> {self.notices}'"]

    def orch(self, *args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-c", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            env=self.env,
        )

    def launch(self, ct: str, *extra: str) -> str:
        res = self.orch("launch", ct, "--no-verify", "--json", *extra)
        assert res.returncode == 0, res.stderr + res.stdout
        doc = json.loads(res.stdout)
        self.preflight = next(
            p["detail"] for p in doc["phases"] if (p["phase"], p["status"]) == ("preflight", "ok")
        )
        return str(doc["run_id"])

    def supervise(self, *targets: str, interval: float = 0.5) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "-c",
                str(self.config),
                "supervise",
                *targets,
                "--db",
                str(self.db),
                "--interval",
                str(interval),
                *self.hook,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=self.env,
        )
        self.procs.append(p)
        return p

    def journal(self, unit: str) -> list:  # type: ignore[type-arg]
        if not self.db.exists():
            return []
        from orchestrator.config.inventory import load_inventory

        with History.open(self.db, inventory=load_inventory(Path(self.config))) as h:
            return h.journal(unit)  # its rows: keyed by the inventory's identities

    def actions(self, unit: str) -> list[str]:
        return [e.action for e in self.journal(unit)]

    def deliveries(self) -> list[dict]:  # type: ignore[type-arg]
        if not self.notices.exists():
            return []
        return [json.loads(x) for x in self.notices.read_text().splitlines() if x.strip()]

    def run_dir(self, ct: str, run_id: str) -> Path:
        return Path(self.sandbox.workdir(ct)) / "runs" / run_id

    def stop(self, p: subprocess.Popen[str]) -> tuple[int, str]:
        """SIGTERM, as systemd stops it; its exit code and output."""
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
        return p.returncode, out


@pytest.fixture
def heal(config: Path, tmp_path: Path, sandbox, sandbox_scenario):  # type: ignore[no-untyped-def]
    sandbox_scenario("idle")
    h = Heal(config, tmp_path, sandbox)
    yield h
    for p in h.procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    for ct in ("ct200", "ct201", "ct202"):
        h.orch("stop", ct, "--grace", "3")


def _exited(run_dir: Path) -> int | None:
    f = run_dir / "exit_status"
    return int(f.read_text().split()[0]) if f.exists() and f.read_text().strip() else None


def _resumed_at(log: str) -> int:
    line = next(x for x in log.splitlines() if x.startswith("trainer: resumed from "))
    return int(line.split(" at step=")[1].split()[0])


def test_supervise_relaunches_a_crash_with_resume_auto_once(heal: Heal) -> None:
    old = heal.launch("ct200", "--", *CRASH_ONCE)
    assert "the trainer stand-in: torch not checked" in heal.preflight, heal.preflight
    sup = heal.supervise("ct200")
    wait_for(
        lambda: "restarted" in heal.actions("ct200") or "give-up" in heal.actions("ct200"),
        120,
        0.2,
        what="the supervisor's restart",
    )
    journal = heal.journal("ct200")
    assert [e.action for e in journal] == ["wait", "restart", "restarted"], [
        e.line() for e in journal
    ]
    new = journal[-1].new_run_id
    assert new and new != old and journal[-1].procedure == "relaunch"
    old_dir, new_dir = heal.run_dir("ct200", old), heal.run_dir("ct200", new)
    assert _exited(old_dir) == 1
    manifest = json.loads((new_dir / "manifest.json").read_text())
    assert manifest["command"].endswith(" ".join(CRASH_ONCE) + " --resume auto"), manifest[
        "command"
    ]
    assert (
        manifest["env"]["ORCH_RESUME_FROM"]
        == f"{heal.sandbox.container_workdir('ct200')}/runs/{old}"
    )
    crash_to_relaunch = manifest["started_at"] - (old_dir / "exit_status").stat().st_mtime
    print(f"crash -> relaunch: {crash_to_relaunch:.2f} s (backoff 2 s, interval 0.5 s)")
    assert crash_to_relaunch >= 2.0, "never before the backoff"
    wait_for(lambda: _exited(new_dir) is not None, 180, what="the relaunched run to end")
    assert _exited(new_dir) == 0
    log = (new_dir / "train.log").read_text()
    resumed = _resumed_at(log)
    first = json.loads((new_dir / "metrics.jsonl").read_text().splitlines()[0])["step"]
    assert resumed == 20 and first == 21, (resumed, first)  # after the crash's newest checkpoint
    assert "trainer: finished step=60" in log
    time.sleep(1.5)  # three more rounds see the finished run: nothing more happens
    code, out = heal.stop(sup)
    assert code == 0 and "orch supervise: stopped" in out, out
    assert [e.action for e in heal.journal("ct200")].count("restart") == 1
    notes = heal.deliveries()
    assert len(notes) == 1 and notes[0]["notifications"][0]["event"] == "restarted", notes
    assert notes[0]["text"].startswith("orch supervise: WARNING")
    _shown_everywhere(heal, "ct200", old, new)


def _shown_everywhere(heal: Heal, ct: str, old: str, new: str) -> None:
    """The journal's decision is in orch status, orch watch and the dead run's postmortem."""
    (row,) = json.loads(heal.orch("status", ct, "--db", str(heal.db), "--json").stdout)
    assert row["restarts"]["last"]["action"] == "restarted" and row["restarts"]["restarts"] == 1
    assert row["restarts"]["short"].startswith("1/2 restarted ")
    pm = heal.orch("postmortem", ct, "--run", old, "--db", str(heal.db), "--json")
    doc = json.loads(pm.stdout)
    assert [e["action"] for e in doc["restarts"]] == ["wait", "restart", "restarted"], pm.stderr
    assert doc["restarts"][-1]["new_run_id"] == new
    text = heal.orch("postmortem", ct, "--run", old, "--db", str(heal.db)).stdout
    assert "restart journal:" in text and f"restarted {old} -> {new}" in text
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(heal.config),
            "watch",
            "--plain",
            "--interval",
            "1",
            ct,
            "--db",
            str(heal.db),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=heal.env,
    )
    heal.procs.append(watch)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(watch.stdout or ()), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: any(f"heal=restarted({new})" in x for x in seen),
            30,
            what="orch watch's heal= word",
        )
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=20)


def test_check_heal_from_a_loop_relaunches_once(heal: Heal) -> None:
    """The stand-in trainer (same flags, checkpoint steps, resume line and exit codes; the real
    trainer's torch checkpoint and resume: tests/trainer/test_checkpoint.py): its checkpoint of
    step 20 is what the relaunch resumes from."""
    old = heal.launch("ct201", "--", *CRASH_ONCE)
    outputs = []

    def checked() -> bool:
        res = heal.orch("check", "ct201", "--heal", "--db", str(heal.db), "--json", *heal.hook)
        assert "Traceback" not in res.stderr, res.stderr
        outputs.append(json.loads(res.stdout))
        return "restarted" in heal.actions("ct201")

    wait_for(checked, 150, 0.5, what="orch check --heal to restart")
    new = heal.journal("ct201")[-1].new_run_id
    assert new and new != old
    new_dir = heal.run_dir("ct201", new)
    wait_for(lambda: _exited(new_dir) is not None, 180, what="the relaunched run to end")
    for _ in range(2):
        checked()
    assert _exited(new_dir) == 0 and _resumed_at((new_dir / "train.log").read_text()) == 20
    assert [e.action for e in heal.journal("ct201")].count("restart") == 1
    heal_lines = [e["action"] for doc in outputs for e in doc.get("heal", [])]
    assert heal_lines == ["wait", "restart", "restarted"], heal_lines


def test_module_not_found_is_not_restarted_and_pages_once(heal: Heal) -> None:
    old = heal.launch("ct202", "--cmd", "python3 -c 'import orch_no_such_module_xyz'")
    sup = heal.supervise("ct202")
    wait_for(lambda: "give-up" in heal.actions("ct202"), 90, 0.2, what="the give-up")
    wait_for(lambda: heal.deliveries(), 30, 0.2, what="the page")
    time.sleep(2.0)  # four more rounds: no second page, no restart
    heal.stop(sup)
    journal = heal.journal("ct202")
    assert [e.action for e in journal] == ["give-up"], [e.line() for e in journal]
    assert journal[0].cause == "module-not-found" and journal[0].note == "not-retryable"
    (page,) = heal.deliveries()
    note = page["notifications"][0]
    assert (note["event"], note["severity"], note["kind"]) == (
        "give-up",
        "critical",
        "module-not-found",
    )
    assert note["remedy"] and "verdict: log-signature" in " ".join(note["evidence"])
    assert "ModuleNotFoundError" in " ".join(note["evidence"])
    runs = sorted(
        p.name for p in (heal.run_dir("ct202", old).parent).iterdir() if p.name != "current"
    )
    assert runs[-1] == old, "nothing was relaunched"


def test_a_run_stopped_with_orch_stop_is_never_restarted(heal: Heal) -> None:
    old = heal.launch("ct200", "--", "--forever")
    wait_for(lambda: (heal.run_dir("ct200", old) / "train.log").exists(), 30, what="the log")
    assert heal.orch("stop", "ct200", "--grace", "10").returncode == 0
    res = heal.orch(
        "supervise", "ct200", "--db", str(heal.db), "--interval", "0.3", "--rounds", "6", *heal.hook
    )
    assert res.returncode == 0, res.stdout + res.stderr
    journal = heal.journal("ct200")
    assert [(e.action, e.note) for e in journal] == [("none", "operator-stop")], res.stdout
    assert "never restarted" in journal[0].reason and heal.deliveries() == []
    assert (heal.run_dir("ct200", old).parent / "current").read_text().strip() == old


def test_a_crash_loop_stops_at_max_and_pages_once(heal: Heal) -> None:
    heal.launch("ct201", "--", "--steps", "20", "--fault", "crash@1")
    sup = heal.supervise("ct201")
    wait_for(lambda: "give-up" in heal.actions("ct201"), 180, 0.3, what="the give-up")
    time.sleep(1.5)
    heal.stop(sup)
    journal = heal.journal("ct201")
    acts = [e.action for e in journal]
    assert acts.count("restart") == 2 and acts.count("give-up") == 1, [e.line() for e in journal]
    assert journal[-1].note == "budget"
    events = [n["event"] for d in heal.deliveries() for n in d["notifications"]]
    assert events.count("give-up") == 1 and len(events) == 3, events  # two restart notices


def test_seed_002_fx_race_is_healed_by_prewarm_relaunch(heal: Heal, real_config: Path) -> None:
    """The trainer dies of seed 002's race (its real message, from torch's own check); the
    verdict names fx-tracing-race, whose playbook restarts through prewarm-relaunch: the
    devices are warmed one at a time and the relaunch (``--warmup sequential``) runs to the end.
    The real trainer throughout."""
    heal.config = real_config
    old = heal.launch(
        "ct202",
        "--",
        "--steps",
        "30",
        "--warmup",
        "none",
        "--fault",
        "fx-race@1",
        "--set",
        "train.log_every=1",
    )
    assert "imports ok (torch)" in heal.preflight and "stand-in" not in heal.preflight
    sup = heal.supervise("ct202")
    wait_for(
        lambda: {"restarted", "give-up", "restart-failed"} & set(heal.actions("ct202")),
        240,
        0.3,
        what="the prewarm relaunch",
    )
    journal = heal.journal("ct202")
    assert journal[-1].action == "restarted", [e.line() for e in journal]
    assert (journal[-1].cause, journal[-1].procedure) == ("fx-tracing-race", "prewarm-relaunch")
    old_log = (heal.run_dir("ct202", old) / "train.log").read_text()
    assert (
        "Detected that you are using FX to symbolically trace a dynamo-optimized function"
        in old_log
    )
    new_dir = heal.run_dir("ct202", journal[-1].new_run_id)
    wait_for(lambda: _exited(new_dir) is not None, 180, what="the relaunched run to end")
    heal.stop(sup)
    log = (new_dir / "train.log").read_text()
    assert _exited(new_dir) == 0, log[-2000:]
    assert "trainer: warm-up cpu forward+backward" in log and "trainer: finished step=30" in log
    assert "--warmup sequential" in json.loads((new_dir / "manifest.json").read_text())["command"]


def test_a_stall_is_stopped_then_relaunched(heal: Heal, sandbox_config) -> None:  # type: ignore[no-untyped-def]
    """``hang@5``: the run lives but makes no progress (4 s stall timeout here). A stall is
    exempt from the settle-first rule (its run holds its GPUs by definition): the procedure
    stops it (``stop_requested`` by orch's restart, so it never reads as an operator's stop;
    with the policy's ``stop_grace``: 4 s here, not the default 60 s, of which the hung run
    waited out half before its SIGTERM), settles, and relaunches it resuming from its checkpoint
    of step 4."""
    heal.config = sandbox_config(
        SESSION,
        trainer_config="tiny-cpu",
        gpus={"drafter": [6, 7]},
        restart={**POLICY, "stop_grace": "4s"},
        thresholds={"stall_timeout_s": 4},
        env=stand_in_env,
    )
    old = heal.launch(
        "ct201",
        "--",
        "--steps",
        "50",
        "--fault",
        "hang@5",
        "--set",
        "train.log_every=1",
        "--set",
        "train.ckpt_every=2",
    )
    sup = heal.supervise("ct201")
    wait_for(
        lambda: {"restarted", "restart-failed", "give-up"} & set(heal.actions("ct201")),
        180,
        0.3,
        what="the stalled run's restart",
    )
    heal.stop(sup)
    journal = heal.journal("ct201")
    assert [(e.action, e.trigger) for e in journal[:3]] == [
        ("wait", "stall"),
        ("restart", "stall"),
        ("restarted", "stall"),
    ], [e.line() for e in journal]
    old_dir = heal.run_dir("ct201", old)
    stop = json.loads((old_dir / "stop_requested").read_text())
    assert stop["by"].startswith("orch restart by orch supervise pid "), stop
    assert stop["grace_s"] == 4, stop
    assert _exited(old_dir) in (130, 143)
    new_dir = heal.run_dir("ct201", journal[2].new_run_id)
    wait_for(
        lambda: "trainer: resumed from " in (new_dir / "train.log").read_text(),
        60,
        what="the relaunch's resume line",
    )
    assert _resumed_at((new_dir / "train.log").read_text()) == 4
