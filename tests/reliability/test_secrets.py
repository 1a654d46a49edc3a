"""Secrets: a canary planted in hosts.yaml env and in a launch's --env, then every artefact grepped."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import wait_for
from tests.reliability.conftest import CANARY, ROOT
from tests.views.conftest import webhook  # noqa: F401 - the real HTTP receiver fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LAUNCH_CANARY = CANARY + "-launch"
TRAINER = "i=0; while true; do i=$((i+1)); echo step=$i loss=2.0; sleep 0.5; done"


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.fault(
    area="security",
    fault=f"secret env values planted: HF_TOKEN={CANARY} in hosts.yaml env, "
    f"WANDB_API_KEY={LAUNCH_CANARY} in `orch launch --env`",
    must="the canary appears in no artefact orch writes: manifest, postmortem bundle, orch's "
    "own log output, every --json output, webhook bodies, the state DB, export metrics; only "
    "in the run's own 0600 env file",
)
def test_secret_canary_in_no_artefact(fleet, webhook, observe, tmp_path):  # noqa: F811
    doc = yaml.safe_load(fleet.config.read_text())
    doc["containers"]["ct201"]["env"] = {"HF_TOKEN": CANARY, "NCCL_DEBUG": "INFO"}
    config = tmp_path / "secret.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    db, state = tmp_path / "orch.db", tmp_path / "state"
    env = {"ORCH_STATE_DIR": str(state), "XDG_STATE_HOME": str(state), "ORCH_DB": str(db)}
    fleet.scenario("idle")

    outputs: dict[str, str] = {}

    def orch(label: str, *args: str) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-vv", "-c", str(config), *args],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
            env={**_env(), **env},
        )
        outputs[f"`orch {label}` stdout"] = res.stdout
        outputs[f"`orch {label}` stderr (-vv log)"] = res.stderr
        return res

    launched = orch(
        "launch --json",
        "launch",
        "ct201",
        "--cmd",
        TRAINER,
        "--env",
        f"WANDB_API_KEY={LAUNCH_CANARY}",
        "--force",
        "--grace",
        "2",
        "--no-verify",
        "--json",
    )
    assert launched.returncode == 0, launched.stderr[-2000:]
    run_dir = fleet.info.host_path("ct201", json.loads(launched.stdout)["run_dir"])
    orch("status --json", "status", "ct201", "--json")
    orch("snapshot --json", "snapshot", "ct201", "--json")
    orch("runs --json", "runs", "ct201", "--json")
    orch("check --json", "check", "ct201", "--json", "--db", str(db), "--notify", webhook.url)
    pgid = int((run_dir / "pgid").read_text().split()[0])
    fleet.info.kill("ct201", pgid, signal.SIGKILL, group=True)  # a crash: the next check alerts
    wait_for((run_dir / "exit_status").exists, 10, what="the exit status")
    orch(
        "check (crash alert)", "check", "ct201", "--json", "--db", str(db), "--notify", webhook.url
    )
    assert webhook.bodies, "no webhook was sent"
    orch("postmortem --json", "postmortem", "ct201", "--json", "--out", str(tmp_path / "pm"))
    orch("export --textfile", "export", "ct201", "--textfile", str(tmp_path / "metrics.prom"))
    orch("hosts --json", "hosts", "--json")

    artefacts: dict[str, bytes] = {k: v.encode() for k, v in outputs.items()}
    artefacts.update(
        {f"webhook body {i}": json.dumps(b).encode() for i, b in enumerate(webhook.bodies)}
    )
    for p in [db, tmp_path / "metrics.prom", *_files(tmp_path / "pm"), *_files(state)]:
        if p.exists():
            artefacts[str(p.relative_to(tmp_path))] = p.read_bytes()
    env_file = run_dir / "env"  # where the run's values live, and nowhere else: 0600, not shown
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert (
        CANARY.encode() in env_file.read_bytes() and LAUNCH_CANARY.encode() in env_file.read_bytes()
    )
    for p in _files(run_dir):
        if p.name not in ("train.log", "env"):  # the program's own output is not orch's to rewrite
            artefacts[f"run dir: {p.name}"] = p.read_bytes()
    leaks = sorted(k for k, v in artefacts.items() if CANARY.encode() in v)
    checked = len(artefacts)
    kinds = sorted(
        {k.split("/")[0].split(":")[0].split(" stdout")[0].split(" stderr")[0] for k in artefacts}
    )
    observe(f"{checked} artefacts grepped ({', '.join(kinds)}); canary found in: {leaks or 'none'}")
    assert (run_dir / "manifest.json").exists() and any(
        p.suffix == ".md" for p in _files(tmp_path / "pm")
    )
    assert not leaks, leaks


PS_CANARY = CANARY + "-ps"
SHOW_HASH = (
    'for i in $(seq 200); do echo "step=$i sha=$(printf %s "$SECRET_TOKEN" | sha256sum | cut -c1-16)'
    ' hosts=$(printf %s "$HF_TOKEN" | sha256sum | cut -c1-16)"; sleep 0.5; done'
)


@pytest.mark.fault(
    area="security",
    fault=f"secret values on their way to a run: SECRET_TOKEN={PS_CANARY} by `orch launch "
    f"--env`, HF_TOKEN={CANARY}-hosts in hosts.yaml env; every process's command line sampled "
    "(/proc/*/cmdline in a loop, `ps -eww` on the host and inside the container) during the "
    "launch and while the run runs",
    must="the values are on no command line, host or container (not pct exec's, the agent's, "
    "tmux's or the wrapper's); the run still sees both (it prints their hashes)",
)
def test_secret_values_are_on_no_command_line(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    from orchestrator.cli import run

    hosts_canary = CANARY + "-hosts"
    doc = yaml.safe_load(fleet.config.read_text())
    doc["containers"]["ct201"]["env"] = {"HF_TOKEN": hosts_canary}
    config = tmp_path / "secret.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    fleet.scenario("idle")
    out = tmp_path / "argv.json"
    env = {**os.environ, **fleet.info.env()}
    env["PATH"] = f"{fleet.state_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.argv_watch",
            str(out),
            "--pct",
            str(fleet.state_dir / "bin" / "pct"),
            "--vmid",
            "201",
            "--mark",
            "launching=--env-stdin",
            "--mark",
            "running=-secretps/wrapper.sh",
        ],
        stdin=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    assert watch.stdin is not None
    watch.stdin.write(f"{PS_CANARY}\n{hosts_canary}\n")
    watch.stdin.close()
    try:
        wait_for(out.with_suffix(".ready").exists, 30, what="the argv watcher")
        argv = [
            "-c",
            str(config),
            "launch",
            "ct201",
            "--cmd",
            SHOW_HASH,
            "--name",
            "secretps",
            "--env",
            f"SECRET_TOKEN={PS_CANARY}",
            "--force",
            "--grace",
            "2",
            "--no-verify",
        ]
        code = run(argv)  # in this process: pytest's command line carries no value
        assert code == 0, "orch launch failed"
        run_dir = fleet.run_dir("ct201")
        wait_for(
            lambda: "step=4 " in (run_dir / "train.log").read_text(), 30, what="the run's 4th step"
        )
    finally:
        Path(str(out) + ".stop").write_text("")
        watch.wait(timeout=60)
        run(["-c", str(config), "stop", "ct201", "--grace", "2"])
    report = json.loads(out.read_text())
    seen = (run_dir / "train.log").read_text()
    want = [hashlib.sha256(v.encode()).hexdigest()[:16] for v in (PS_CANARY, hosts_canary)]
    observe(
        f"{report['scans']} scans of every /proc/*/cmdline, {report['ps_host']} ps on the "
        f"host, {report['ps_container']} in ct201 (the launch in {report['marks']['launching']}"
        f" scans, the run in {report['container_marks']['running']} in-container ps); values "
        f"found: {len(report['hits'])}; the run saw both: {all(w in seen for w in want)}"
    )
    assert not report["hits"], report["hits"][:5]
    assert report["marks"]["launching"] > 0, "the launch was never sampled: this proves nothing"
    assert report["container_marks"]["running"] > 0 and report["ps_host"] > 0, report
    assert f"sha={want[0]} hosts={want[1]}" in seen, seen[-300:]


def _env() -> dict[str, str]:
    return dict(os.environ)
