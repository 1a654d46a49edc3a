"""orch postmortem end to end through the sandbox (real sshd, pct stand-in, tmux, fake NVML).

Each test starts a real run with ``orch launch`` in its own container and session
(``pm-e2e``), breaks it the way a real run breaks (SIGKILL, the kernel OOM killer,
a killed tmux server, a latched GPU, the bundled trainer dying of the seeds' FX race) and
checks the verdict, the JSON document and the bundle. The HTML report is opened in
headless Chromium.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.views.scales import overlaps
from tests.helpers import wait_for
from tests.postmortem import browser

pytestmark = pytest.mark.e2e

SESSION = "pm-e2e"
SECRET = "hf_postmortemSecretValue42"
TICKER = (
    'echo "token is $HF_TOKEN"; python3 -c "import time\nfor i in range(3000):\n'
    "    print('tick', i, flush=True); time.sleep(0.1)\""
)
# The bundled trainer (orch launch's default command), dying of seed 002's race for real.
FX_RACE = ("--config", "tiny-cpu", "--steps", "5", "--warmup", "none", "--fault", "fx-race@1")
SEED_002 = (
    "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function. This is not supported at the moment."
)


@pytest.fixture(scope="module")
def config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """The sandbox's hosts.yaml with our own session name and a secret in the env."""
    return sandbox_config(SESSION, env={"HF_TOKEN": SECRET})


@pytest.fixture
def orch(config: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch,
         sandbox_scenario):  # type: ignore[no-untyped-def]  # fmt: skip
    """``orch -c CONFIG ARGS`` in-process: (exit code, stdout, stderr); state dir in tmp.

    The sandbox's GPUs start idle (the healthy scenario's are busy: launch would refuse).
    """
    sandbox_scenario("idle")
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    used: list[str] = []

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        if args and args[0] == "launch":
            used.append(args[1])
        code = run(["-c", str(config), *args])
        out, err = capsys.readouterr()
        return code, out, err

    yield call
    for name in dict.fromkeys(used):
        call("stop", name, "--grace", "3")


def _launch(orch, sandbox, name: str, cmd: str, run_name: str) -> Path:  # type: ignore[no-untyped-def]
    code, out, err = orch(
        "launch",
        name,
        "--cmd",
        cmd,
        "--name",
        run_name,
        "--force",
        "--grace",
        "3",
        "--no-verify",
        "--json",
    )
    assert code == 0, err + out
    return sandbox.host_path(name, json.loads(out)["run_dir"])  # the container's path, from here


def _launch_trainer(orch, sandbox, name: str, run_name: str, *trainer_args: str) -> Path:  # type: ignore[no-untyped-def]
    """``orch launch NAME -- TRAINER_ARGS``: the bundled trainer, deployed by orch."""
    code, out, err = orch(
        "launch",
        name,
        "--name",
        run_name,
        "--force",
        "--grace",
        "3",
        "--no-verify",
        "--json",
        "--",
        *trainer_args,
    )
    assert code == 0, err + out
    return sandbox.host_path(name, json.loads(out)["run_dir"])  # the container's path, from here


def _command_pid(sandbox, name: str, run_dir: Path) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(host PID, container PID) of the run's python3 (the process the OOM killer would pick)."""
    pgid = int((run_dir / "pgid").read_text().split()[0])  # as the container numbers it
    host_pgid = sandbox.host_pid(name, pgid, group=True)

    def find() -> tuple[int, int] | None:
        for pid in sandbox.container_pids(name):
            try:
                st = Path(f"/proc/{pid}/stat").read_text()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                inner = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0]
            except (OSError, IndexError):
                continue
            if int(st[st.rfind(")") + 2 :].split()[2]) == host_pgid and comm.startswith("python"):
                return pid, int(inner.split()[-1])
        return None

    return wait_for(find, 20, what="the run's python3 process")


def _recorded(run_dir: Path, pid: int) -> bool:
    """The flight recorder has sampled ``pid`` (so the postmortem knows it was the run's)."""
    try:
        return f'"pid":{pid},' in (run_dir / "gpu.jsonl").read_text()
    except FileNotFoundError:
        return False


def _postmortem(orch, name: str, out: Path) -> dict:  # type: ignore[no-untyped-def]
    code, stdout, err = orch("postmortem", name, "--out", str(out), "--json")
    assert code == 0, err + stdout
    assert SECRET not in stdout
    doc = json.loads(stdout)
    assert doc["bundle"] == str(out)
    return doc


def _check_bundle(out: Path) -> None:
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    names = {p.name for p in out.iterdir()}
    assert {
        "manifest.json",
        "exit_status",
        "log-tail.txt",
        "pane.txt",
        "gpu.jsonl",
        "kernel.log",
        "pct-status.txt",
        "findings.json",
        "report.md",
        "report.html",
    } <= names, names
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert SECRET not in p.read_text(errors="replace"), f"secret leaked into {p.name}"
    assert "running" in (out / "pct-status.txt").read_text()


@pytest.mark.unprivileged
def test_sigkill_is_crashed_137(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_dir = _launch(orch, sandbox, "ct200", TICKER, "pmkill")
    pid, _ = _command_pid(sandbox, "ct200", run_dir)
    wait_for(lambda: "tick 3" in (run_dir / "train.log").read_text(), 20, what="ticks")
    os.kill(pid, signal.SIGKILL)
    wait_for((run_dir / "exit_status").exists, 15, what="the wrapper's exit status")

    doc = _postmortem(orch, "ct200", tmp_path / "b")
    v = doc["verdict"]
    assert v["kind"] == "crashed", v
    assert v["playbook"] is None, "no OOM line in the kernel log: not an OOM verdict"
    assert "137" in v["summary"] and "SIGKILL" in v["summary"] and "no OOM-killer" in v["summary"]
    assert doc["exit_status"] == 137
    assert any(f["kind"] == "crashed" for f in doc["findings"])
    _check_bundle(tmp_path / "b")
    assert (tmp_path / "b" / "exit_status").read_text() == "137\n"
    assert "tick" in (tmp_path / "b" / "log-tail.txt").read_text()
    assert SECRET in (run_dir / "train.log").read_text(), "the run itself printed the secret"
    assert "token is ***" in (tmp_path / "b" / "log-tail.txt").read_text()
    assert "[orch] command exited with status 137" in (tmp_path / "b" / "pane.txt").read_text()


def test_oom_killer_line_for_the_pid_is_oom_verdict(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The kernel names the victim by its host PID and memory cgroup, as in a real container;
    the flight recorder saw the PID the container knows it by."""
    from orchestrator.sandbox.kernel import append_kernel_line

    run_dir = _launch(orch, sandbox, "ct201", TICKER, "pmoom")
    pid, inner = _command_pid(sandbox, "ct201", run_dir)
    wait_for(lambda: _recorded(run_dir, inner), 20, what="a flight-recorder sample of the run")
    memcg = Path(f"/proc/{pid}/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
    append_kernel_line(
        sandbox.state_dir,
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"global_oom,task_memcg={memcg},task=python3,pid={pid},uid=0",
        level=6,
    )
    append_kernel_line(
        sandbox.state_dir,
        f"Out of memory: Killed process {pid} (python3) total-vm:81234560kB, "
        "anon-rss:65432100kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:131072kB oom_score_adj:0",
        level=3,
    )
    os.kill(pid, signal.SIGKILL)
    wait_for((run_dir / "exit_status").exists, 15, what="the wrapper's exit status")

    doc = _postmortem(orch, "ct201", tmp_path / "b")
    v = doc["verdict"]
    assert v["kind"] == "oom-killer" and v["playbook"] == "oom-killer", v
    assert f"pid {pid}" in v["summary"]
    assert any(f"Killed process {pid}" in e for e in v["evidence"])
    assert f"Killed process {pid}" in (tmp_path / "b" / "kernel.log").read_text()
    _check_bundle(tmp_path / "b")


def test_killed_tmux_server_is_silent_death(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The OOM test's kill in ct201 (named by host PID, its task_memcg in ct201) may be seconds
    old: the host gives it to ct201, so it never explains this run's death by process name."""
    from orchestrator.sandbox import manager

    run_dir = _launch(orch, sandbox, "ct202", TICKER, "pmvanish")
    wait_for(lambda: "tick 3" in (run_dir / "train.log").read_text(), 20, what="ticks")
    # Seed 000: everything went at once (wrapper, command, tmux server): nobody wrote an exit status.
    sandbox.kill("ct202", int((run_dir / "wrapper.pid").read_text().split()[0]))
    sandbox.kill("ct202", int((run_dir / "pgid").read_text().split()[0]), group=True)
    assert manager.kill_tmux_server(sandbox.state_dir, "ct202")

    doc = _postmortem(orch, "ct202", tmp_path / "b")
    v = doc["verdict"]
    assert v["kind"] == "silent-death" and v["playbook"] == "silent-death", v
    assert doc["exit_status"] is None
    assert any("tmux: no server running" in e for e in v["evidence"]), v["evidence"]
    _check_bundle(tmp_path / "b")
    assert (tmp_path / "b" / "exit_status").read_text() == "missing\n"


def test_ghost_scenario_is_ghost_utilization(orch, sandbox, sandbox_scenario, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario("ghost")
    run_dir = _launch(orch, sandbox, "ct200", TICKER, "pmghost")
    wait_for(
        lambda: (
            (run_dir / "gpu.jsonl").exists()
            and len((run_dir / "gpu.jsonl").read_text().splitlines()) >= 2
        ),
        20,
        what="two flight-recorder samples",
    )
    code, stdout, err = orch("postmortem", "ct200", "--json")  # default bundle dir
    assert code == 0, err + stdout
    doc = json.loads(stdout)
    v = doc["verdict"]
    assert v["kind"] == "ghost-utilization" and v["playbook"] == "ghost-utilization", v
    ghost = [f for f in doc["findings"] if f["kind"] == "ghost-utilization"]
    assert ghost and ghost[0]["gpus"] == [3]
    bundle = Path(doc["bundle"])
    assert bundle.parent == tmp_path / "state" / "postmortems"
    assert bundle.name.startswith(f"ct200-{run_dir.name}-")
    _check_bundle(bundle)
    episodes = [e for e in doc["episodes"] if e["kind"] == "ghost-utilization"]
    assert [e["gpu"] for e in episodes] == [3] and episodes[0]["cleared_at"] is None, episodes
    page = (bundle / "report.html").read_text()
    assert "Episodes in the GPU history (1)" in page, "the ghost episode is listed"
    assert "still on at the last sample (the finding above)" in page
    _screenshot(bundle / "report.html", tmp_path)
    # the text view names the verdict and the remedy
    code, stdout, _ = orch("postmortem", "ct200", "--out", str(tmp_path / "text"))
    assert code == 0 and "ghost-utilization" in stdout and "remedy:" in stdout


def test_fx_race_of_the_real_trainer_is_fx_tracing_race(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--warmup none --fault fx-race@1``: the trainer's worker threads hit torch's own FX
    check (``trainer/fxrace.py``); the postmortem names the playbook and its warm-up remedy."""
    run_dir = _launch_trainer(orch, sandbox, "ct201", "pmfx", *FX_RACE)
    wait_for((run_dir / "exit_status").exists, 240, 0.5, what="the trainer's crash")
    log = (run_dir / "train.log").read_text()
    assert SEED_002 in log and "torch/_dynamo/eval_frame.py" in log, log[-3000:]

    out = tmp_path / "b"
    doc = _postmortem(orch, "ct201", out)
    v = doc["verdict"]
    assert v["kind"] == "log-signature" and v["playbook"] == "fx-tracing-race", v
    assert any(SEED_002 in e for e in v["evidence"]), v["evidence"]
    assert any("warm" in r.lower() for r in v["remedy"])
    assert doc["exit_status"] == 1
    _check_bundle(out)
    assert SEED_002 in (out / "log-tail.txt").read_text()
    _screenshot(out / "report.html", tmp_path)


@pytest.mark.unprivileged
def test_orch_stop_is_stopped_and_pages_nobody(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_dir = _launch(orch, sandbox, "ct202", TICKER, "pmstop")
    wait_for(lambda: "tick 3" in (run_dir / "train.log").read_text(), 20, what="ticks")
    code, out, err = orch("stop", "ct202", "--grace", "10", "--json")
    assert code == 0, err + out
    stopped = json.loads(out)
    assert stopped["exit_status"] == 130 and stopped["signals"] == ["SIGINT"], stopped
    request = json.loads((run_dir / "stop_requested").read_text())
    assert request["by"].startswith("orch stop by ") and request["signal"] == "SIGINT"

    # orch check: the operator's stop is info (finished), not a critical crashed page.
    code, out, err = orch("check", "ct202", "--json", "--db", str(tmp_path / "orch.db"))
    doc = json.loads(out)
    assert code != 2 and doc["status"] != "CRITICAL", doc
    (target,) = doc["targets"]
    kinds = {f["kind"]: f for f in target["findings"]}
    assert "crashed" not in kinds, kinds
    assert all(f["severity"] != "critical" for f in target["findings"]), target["findings"]

    doc = _postmortem(orch, "ct202", tmp_path / "b")
    v = doc["verdict"]
    assert v["kind"] == "stopped" and v["severity"] == "info", v
    assert "stopped by orch stop by" in v["summary"] and "(SIGINT)" in v["summary"], v
    assert "exit 130" in v["summary"] and "checkpoint" in v["summary"]
    assert not any(f["kind"] == "crashed" for f in doc["findings"]), doc["findings"]
    _check_bundle(tmp_path / "b")


def test_bundle_is_never_overwritten(orch, sandbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = orch("postmortem", "ct201", "--out", str(out))
    assert code == 4 and "not empty" in err
    assert (out / "keep.txt").read_text() == "mine"
    code, _, err = orch("postmortem", "ct201", "--run", "no-such-run", "--out", str(tmp_path / "x"))
    assert code == 2 and "no-such-run" in err


# --- headless Chromium ---------------------------------------------------------------------------


def _screenshot(report: Path, tmp_path: Path) -> None:
    """Open the report in headless Chromium; the screenshot must exist and not be blank, and
    the charts Chromium laid out fill the page's width with no marker label over another."""
    data = browser.screenshot(report, tmp_path / "report.png", 1200, 900, tmp_path / "chromium")
    assert len(data) > 10_000, f"screenshot only {len(data)} bytes"
    assert browser.colors(data) > 8, "the screenshot is blank"
    got = browser.measure(report, 1200, tmp_path / "chromium")
    assert got["charts"], "no chart in the report"
    for chart in got["charts"]:
        left, _, right, _ = chart["box"]
        assert right - left >= got["body"] - 1, (chart["box"], got["body"])
        assert overlaps(chart["markers"]) == [], chart["markers"]
