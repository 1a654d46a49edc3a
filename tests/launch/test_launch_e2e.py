"""orch launch/stop/logs/runs/status end to end through the sandbox (real sshd, pct stand-in, tmux).

These tests use their own tmux session name (``launch-e2e``) in the session sandbox's
containers, so runs of other test areas in ``train`` are never touched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import run
from tests.helpers import old_python, wait_for

pytestmark = pytest.mark.e2e

SESSION = "launch-e2e"
TICKER = (
    'python3 -c "import time\nfor i in range(600):\n'
    "    print('tick', i, flush=True); time.sleep(0.1)\""
)


@pytest.fixture(scope="module")
def config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """The sandbox's hosts.yaml with our session, a trainer config and a broken ``requires``."""
    return sandbox_config(
        SESSION,
        containers={
            "ct200": {"trainer_config": "tiny-cpu"},
            "ct201": {"requires": ["yaml", "no_such_module_xyz"]},
        },
    )


@pytest.fixture
def idle(sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario("idle")


@pytest.fixture
def orch(config: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """``orch -c CONFIG ARGS`` in-process: (exit code, stdout, stderr)."""

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(["-c", str(config), *args])
        out, err = capsys.readouterr()
        return code, out, err

    yield call
    call("stop", "ct200", "--grace", "5")
    call("stop", "ct202", "--grace", "5")


def _runs(workdir: Path) -> set[str]:
    root = workdir / "runs"
    return {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


def test_bundled_trainer_happy_path_logs_and_stop(orch, idle, sandbox) -> None:  # type: ignore[no-untyped-def]
    # --forever: the run lasts until the stop below, however fast the machine trains
    code, out, err = orch("launch", "ct200", "--name", "happy", "--json", "--", "--forever")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["verified"] is True and doc["run_id"].endswith("-happy")
    assert [p["phase"] for p in doc["phases"] if p["status"] == "ok"] == [
        "preflight",
        "deploy",
        "start",
        "verify",
    ]
    log = sandbox.host_path("ct200", doc["log_path"])
    assert log.read_text().startswith("trainer: version="), "first line of the program in the log"
    manifest = json.loads((log.parent / "manifest.json").read_text())
    assert manifest["gpus"] == list(range(8)) and manifest["target"] == "ct200"
    assert manifest["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"

    wait_for(lambda: "step=" in log.read_text(), 60, what="a training step")
    code, out, _ = orch("logs", "ct200", "-n", "2")
    assert code == 0 and len(out.splitlines()) == 2

    code, out, err = orch("stop", "ct200", "--grace", "30", "--json")
    assert code == 0, err
    stopped = json.loads(out)
    assert stopped["stopped"] is True and stopped["signals"] == ["SIGINT"]
    assert stopped["exit_status"] == 130  # the trainer's documented exit after a SIGINT checkpoint
    assert "checkpoint" in log.read_text().splitlines()[-1]
    code, out, _ = orch("stop", "ct200", "--json")
    assert code == 0 and json.loads(out)["stopped"] is False
    code, out, _ = orch("runs", "ct200", "--json")
    mine = [r for r in json.loads(out)["runs"] if r["run_id"] == doc["run_id"]]
    assert mine and mine[0]["state"] == "exited" and mine[0]["exit_status"] == 130
    assert mine[0]["log_size_bytes"] == log.stat().st_size


def test_instant_failure_reported_fast_with_127(orch, idle) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    code, out, err = orch("launch", "ct202", "--cmd", "no-such-program", "--name", "instant")
    elapsed_s = time.monotonic() - t0
    assert code == 1
    assert elapsed_s < 15.0, f"took {elapsed_s:.1f} s"
    assert "exit status 127" in err
    assert "no-such-program: command not found" in err
    print(f"instant failure reported in {elapsed_s:.2f} s")


def test_live_session_refused_then_force_keeps_old_run(orch, idle, sandbox) -> None:  # type: ignore[no-untyped-def]
    workdir = sandbox.workdir("ct202")
    code, out, err = orch("launch", "ct202", "--cmd", TICKER, "--name", "first", "--json")
    assert code == 0, err
    first = json.loads(out)
    before = _runs(workdir)

    code, out, err = orch("launch", "ct202", "--cmd", "echo second", "--name", "second")
    assert code == 4, err
    assert f"tmux session '{SESSION}' is live" in err and "--force" in err
    assert _runs(workdir) == before, "a refused launch must not create a run"

    code, out, err = orch(
        "launch", "ct202", "--cmd", TICKER, "--name", "second", "--force", "--grace", "10", "--json"
    )
    assert code == 0, err
    second = json.loads(out)
    old = sandbox.host_path("ct202", first["run_dir"])
    assert (old / "train.log").read_text().startswith("tick 0")
    assert (old / "manifest.json").exists() and (old / "exit_status").exists()
    assert (old / "pane.txt").exists(), "the old pane's last screen is archived"
    assert second["replaced"]["run_id"] == first["run_id"]
    assert (sandbox.host_path("ct202", second["run_dir"]) / "train.log").exists()


@pytest.mark.unprivileged
def test_busy_gpus_refused_before_anything_starts(orch, sandbox, sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario("healthy")
    before = _runs(sandbox.workdir("ct201"))
    code, out, err = orch("launch", "ct201", "--cmd", "echo hi", "--gpus", "0-1")
    assert code == 4
    assert "GPU 0 busy: 118234 MiB used, processes: pid 412301" in err
    assert "GPU 1 busy" in err and "GPU 2" not in err
    assert _runs(sandbox.workdir("ct201")) == before


def test_missing_requires_module_refused(orch, idle, sandbox) -> None:  # type: ignore[no-untyped-def]
    before = _runs(sandbox.workdir("ct201"))
    code, out, err = orch("launch", "ct201", "--cmd", "echo hi")
    assert code == 4
    assert "module 'no_such_module_xyz' does not import" in err
    assert "pip install no_such_module_xyz" in err and "'yaml'" not in err
    assert _runs(sandbox.workdir("ct201")) == before


def test_status_over_several_containers(orch, idle) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    code, out, err = orch("status", "ct200", "ct201", "ct202", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["target"] for r in rows] == ["ct200", "ct201", "ct202"]
    assert all(r["reachable"] and r["container"] == "running" for r in rows), rows
    assert all(r["gpus"] == 8 and r["gpus_busy"] == 0 for r in rows)
    print(f"status of 3 containers in {time.monotonic() - t0:.2f} s")


def test_attach_command_line(orch) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = orch("attach", "ct200", "--print")
    assert code == 0
    assert out.startswith("ssh -t -p ")
    assert "'pct exec 200 -- env TERM=xterm-256color tmux attach-session -t =launch-e2e'" in out


def test_logs_follow_through_ssh_ends_with_the_run(orch, idle) -> None:  # type: ignore[no-untyped-def]
    cmd = "for i in 1 2 3 4 5 6; do echo line-$i; sleep 0.4; done"
    code, _, err = orch("launch", "ct202", "--cmd", cmd, "--no-verify", "--force", "--grace", "5")
    assert code == 0, err
    code, out, err = orch("logs", "ct202", "-f", "-n", "100")
    assert code == 0, err
    assert out.splitlines() == [f"line-{i}" for i in range(1, 7)]
    assert "run ended: exit status 0" in err


def test_python_39_in_the_container_is_refused_saying_what_to_do(
    sandbox, sandbox_config, idle, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Debian 11 / Ubuntu 20.04 ship python 3.9: the launch stops at preflight, says which
    python is too old, what orch needs and how to get it, and starts nothing."""
    base = yaml.safe_load(Path(sandbox.config_path).read_text())["containers"]["ct202"]
    old = old_python(sandbox, "ct202", base.get("python", "python3"))
    config = sandbox_config(SESSION, containers={"ct202": {"python": old}})
    before = _runs(sandbox.workdir("ct202"))
    capsys.readouterr()
    code = run(["-c", str(config), "launch", "ct202", "--cmd", "sleep 30"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert (
        f"error: ct202: {old} is Python 3.9.2; orch's agent needs Python >= 3.10 (Debian 11, "
        "Ubuntu 20.04 and Proxmox VE 7 ship 3.9); install Python >= 3.10 in ct202 and point "
        "python: of ct202 in hosts.yaml at it"
    ) in err, err
    assert "Traceback" not in err and _runs(sandbox.workdir("ct202")) == before


def test_status_says_missing_for_a_vmid_the_host_does_not_have(sandbox, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """pct answered "Configuration file ... does not exist": the host is reachable and the
    container missing, as orch check and orch snapshot say; not unreachable."""
    doc = yaml.safe_load(Path(sandbox.config_path).read_text())
    doc["containers"]["ct299"] = {**doc["containers"]["ct200"], "vmid": 299}
    config = tmp_path / "missing-vmid.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    config.chmod(0o600)
    capsys.readouterr()
    code = run(["-c", str(config), "status", "ct299", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)[0]
    assert row["reachable"] is True and row["container"] == "missing", row
    assert row["state"] == "stopped" and "299" in row["error"], row
