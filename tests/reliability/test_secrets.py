"""Secrets: a canary planted in hosts.yaml env and in a launch's --env, then every artefact grepped."""

from __future__ import annotations

import json
import signal
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
    "own log output, every --json output, webhook bodies, the state DB, export metrics",
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
            capture_output=True, text=True, timeout=180, cwd=ROOT, env={**_env(), **env},
        )  # fmt: skip
        outputs[f"`orch {label}` stdout"] = res.stdout
        outputs[f"`orch {label}` stderr (-vv log)"] = res.stderr
        return res

    launched = orch("launch --json", "launch", "ct201", "--cmd", TRAINER, "--env",
                    f"WANDB_API_KEY={LAUNCH_CANARY}", "--force", "--grace", "2", "--no-verify", "--json")  # fmt: skip
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
    for p in _files(run_dir):
        if p.name != "train.log":  # the program's own output is not orch's to rewrite
            artefacts[f"run dir: {p.name}"] = p.read_bytes()
    leaks = sorted(k for k, v in artefacts.items() if CANARY.encode() in v)
    checked = len(artefacts)
    kinds = sorted({k.split("/")[0].split(":")[0].split(" stdout")[0].split(" stderr")[0]
                    for k in artefacts})  # fmt: skip
    observe(f"{checked} artefacts grepped ({', '.join(kinds)}); canary found in: {leaks or 'none'}")
    assert (run_dir / "manifest.json").exists() and any(
        p.suffix == ".md" for p in _files(tmp_path / "pm")
    )
    assert not leaks, leaks


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
