"""The in-container lifecycle (agent launch/stop/runs/logs) against a real, private tmux server."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent import answer, logs, rundir, tmux
from tests.helpers import wait_for
from tests.launch.conftest import LocalAgent


def launch(
    agent: LocalAgent, cmd: str, *extra: str, session: str = "train", stdin: str | None = None
) -> tuple[int, dict]:
    return agent(
        "launch",
        "--workdir",
        str(agent.workdir),
        "--session",
        session,
        "--cmd",
        cmd,
        "--no-recorder",
        *extra,
        stdin=stdin,
    )


def state(agent: LocalAgent, run_id: str, session: str = "train") -> dict:
    return rundir.run_state(agent.workdir / "runs" / run_id, tail=20, session=None).to_dict() | {
        "tmux": session_info(agent, session)
    }


def session_info(agent: LocalAgent, session: str) -> dict:
    fmt = "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}"
    res = agent.tmux("list-panes", "-s", "-t", f"={session}", "-F", fmt)
    if res.returncode != 0:
        return {"exists": False}
    dead, status, sig = res.stdout.strip().split("|")
    return {"exists": True, "dead": dead == "1", "status": status, "signal": sig}


def exit_status(agent: LocalAgent, run_id: str) -> int | None:
    path = agent.workdir / "runs" / run_id / "exit_status"
    return int(path.read_text()) if path.exists() else None


def test_instant_failure_keeps_pane_log_and_exit_status(local_agent: LocalAgent) -> None:
    t0 = time.monotonic()
    rc, doc = launch(local_agent, "no-such-program", "--run-id", "r1", "--settle", "3")
    elapsed_s = time.monotonic() - t0
    assert rc == 0, doc
    assert doc["history_limit"] == tmux.HISTORY_LIMIT
    # The agent's settle window already saw the death: no waiting for a poll.
    assert doc["state"]["state"] == "exited" and doc["state"]["exit_status"] == 127
    assert any("no-such-program: command not found" in x for x in doc["state"]["log_tail"])
    assert elapsed_s < 3.0, elapsed_s
    # remain-on-exit was in force before the command could die: the pane and its status stay.
    info = wait_for(
        lambda: (i := session_info(local_agent, "train"))["status"] and i, 5, what="pane status"
    )
    assert info == {"exists": True, "dead": True, "status": "127", "signal": ""}
    shown = local_agent.tmux("show-options", "-w", "-v", "-t", "=train:run", "remain-on-exit")
    assert shown.stdout.strip() == "on"
    pane = local_agent.tmux("capture-pane", "-p", "-S", "-", "-t", "=train:run").stdout
    assert "command not found" in pane


def test_sigkill_leaves_137(local_agent: LocalAgent) -> None:
    cmd = "python3 -c \"import time; print('ready', flush=True); time.sleep(60)\""
    rc, doc = launch(local_agent, cmd, "--run-id", "k1")
    assert rc == 0, doc
    run_dir = local_agent.workdir / "runs" / "k1"
    wait_for(lambda: "ready" in (run_dir / "train.log").read_text(), 10, what="ready line")
    pids = rundir.run_state(run_dir).command_pids
    python = [p for p in pids if b"time.sleep" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(python) == 1, pids
    os.kill(python[0], signal.SIGKILL)
    assert wait_for(lambda: exit_status(local_agent, "k1"), 10, what="exit_status") == 137
    info = wait_for(lambda: (i := session_info(local_agent, "train"))["status"] and i, 5)
    assert info["status"] == "137"
    assert rundir.run_state(run_dir).state == "exited"


def test_wrapper_killed_by_signal_reads_pane_dead_signal(local_agent: LocalAgent) -> None:
    """SIGKILL to the wrapper itself: no exit_status, tmux reports the signal, the run vanished."""
    rc, doc = launch(local_agent, "sleep 60", "--run-id", "w1")
    assert rc == 0, doc
    run_dir = local_agent.workdir / "runs" / "w1"
    wrapper_pid = int((run_dir / "wrapper.pid").read_text().split()[0])
    wait_for(lambda: (run_dir / "pgid").exists(), 5, what="pgid")
    pgid = int((run_dir / "pgid").read_text())
    os.kill(wrapper_pid, signal.SIGKILL)
    os.killpg(pgid, signal.SIGKILL)
    info = wait_for(lambda: (i := session_info(local_agent, "train"))["signal"] and i, 5)
    assert info == {"exists": True, "dead": True, "status": "", "signal": "9"}
    rc, doc = local_agent(
        "runs", "--workdir", str(local_agent.workdir), "--current", "--session", "train"
    )
    assert doc["state"] == "vanished" and doc["exit_status"] is None
    assert doc["tmux"]["pane_dead_signal"] == 9 and doc["tmux"]["pane_dead_status"] is None


def test_log_holds_first_line_even_with_exec(local_agent: LocalAgent) -> None:
    """Seed 000: `exec` in the start command bypassed tee. Here the exec stays inside the pipe."""
    cmd = "exec python3 -c \"print('first line of output'); print('second')\""
    rc, doc = launch(local_agent, cmd, "--run-id", "t1")
    assert rc == 0, doc
    assert wait_for(lambda: exit_status(local_agent, "t1") is not None, 10)
    log = local_agent.workdir / "runs" / "t1" / "train.log"
    assert log.read_text().splitlines()[:2] == ["first line of output", "second"]
    assert exit_status(local_agent, "t1") == 0


def test_env_arrives_literally_and_runs_nothing(local_agent: LocalAgent, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    nasty = f"a b;touch {canary}`touch {canary}`$(touch {canary})'\"\\$HOME\n2nd"
    out = tmp_path / "out.json"
    cmd = (
        'python3 -c "import json, os; json.dump({k: os.environ.get(k) for k in '
        "['NASTY', 'HF_TOKEN', 'CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'PYTHONUNBUFFERED']},"
        f" open('{out}', 'w'))\""
    )
    env = json.dumps({"env": {"NASTY": nasty, "HF_TOKEN": "hf_secret"}})
    rc, doc = launch(
        local_agent, cmd, "--run-id", "e1", "--env-stdin", "--gpus", "0-2,5", stdin=env
    )
    assert rc == 0, doc
    assert wait_for(lambda: exit_status(local_agent, "e1") is not None, 10) is True
    assert exit_status(local_agent, "e1") == 0
    got = json.loads(out.read_text())
    assert got == {
        "NASTY": nasty,
        "HF_TOKEN": "hf_secret",
        "CUDA_VISIBLE_DEVICES": "0,1,2,5",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PYTHONUNBUFFERED": "1",
    }
    assert not canary.exists()
    manifest = json.loads((local_agent.workdir / "runs" / "e1" / "manifest.json").read_text())
    assert manifest["env"]["HF_TOKEN"] == "***" and manifest["env"]["NASTY"] == nasty
    assert manifest["gpus"] == [0, 1, 2, 5] and manifest["command"] == cmd
    assert "hf_secret" not in json.dumps(doc)


def test_the_run_gets_its_own_environment_not_the_tmux_servers(
    local_agent: LocalAgent, tmp_path: Path
) -> None:
    """Whoever started the tmux server (an operator's shell, with SSH_* and XDG_*) does not
    hand its environment to the run: the run gets the agent's (the transport set it
    explicitly) and the variables it was given, nothing else."""
    agent_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "TMUX_TMPDIR": local_agent.env["TMUX_TMPDIR"],
        "PYTHONPATH": local_agent.env["PYTHONPATH"],
    }
    dirty = {
        "SSH_CONNECTION": "10.9.9.9 50000 10.9.9.1 22",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "OPERATOR_ONLY": "from-the-operators-shell",
    }
    started = subprocess.run(
        ["tmux", "new-session", "-d", "-s", "operator", "sleep 600"],
        env={**agent_env, **dirty},
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr
    agent = LocalAgent(env=agent_env, workdir=local_agent.workdir)
    out = tmp_path / "seen.env"
    rc, doc = launch(
        agent,
        f"env -0 > {out}",
        "--run-id",
        "clean",
        "--env-stdin",
        stdin=json.dumps({"env": {"HF_TOKEN": "hf_given"}}),
    )
    assert rc == 0, doc
    assert wait_for(lambda: exit_status(agent, "clean") is not None, 10, what="the run's end")
    seen = dict(x.split("=", 1) for x in out.read_text().split("\0") if x)
    assert not set(dirty) & set(seen), sorted(seen)
    assert not [k for k in seen if k.startswith(("SSH_", "XDG_", "TMUX_PANE"))], sorted(seen)
    assert "TMUX" not in seen, "the run thinks it is a tmux client"
    assert {k: seen[k] for k in ("PATH", "HOME", "LANG")} == {
        k: agent_env[k] for k in ("PATH", "HOME", "LANG")
    }
    assert seen["HF_TOKEN"] == "hf_given" and seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["ORCH_RUN_DIR"] == str(agent.workdir / "runs" / "clean")


def test_the_env_file_is_private_and_a_forced_replacement_keeps_the_old_one(
    local_agent: LocalAgent,
) -> None:
    """The values live in one 0600 file per run; ``launch --force`` stops the old run but
    neither rewrites, removes nor copies its file, and no other file holds a value."""
    runs = local_agent.workdir / "runs"
    rc, doc = launch(
        local_agent,
        "echo old; sleep 60",
        "--run-id",
        "o1",
        "--env-stdin",
        stdin=json.dumps({"env": {"HF_TOKEN": "hf_old_value"}}),
    )
    assert rc == 0, doc
    old = runs / "o1" / rundir.ENV
    before = old.read_bytes()
    assert b"HF_TOKEN=hf_old_value\0" in before and stat.S_IMODE(old.stat().st_mode) == 0o600
    wait_for(lambda: "old" in (runs / "o1" / "train.log").read_text(), 10, what="old's output")
    rc, doc = launch(
        local_agent,
        "sleep 60",
        "--run-id",
        "n1",
        "--env-stdin",
        "--force",
        "--grace",
        "2",
        stdin=json.dumps({"env": {"WANDB_API_KEY": "wb_new_value"}}),
    )
    assert rc == 0 and doc["replaced"]["run_id"] == "o1", doc
    assert (runs / "o1" / "pane.txt").exists(), "the old pane was not archived"
    assert old.read_bytes() == before and stat.S_IMODE(old.stat().st_mode) == 0o600
    new = (runs / "n1" / rundir.ENV).read_bytes()
    assert b"WANDB_API_KEY=wb_new_value\0" in new and b"hf_old_value" not in new
    assert stat.S_IMODE((runs / "n1" / rundir.ENV).stat().st_mode) == 0o600
    values = (b"hf_old_value", b"wb_new_value")
    holders = sorted(
        str(f.relative_to(runs))
        for f in runs.rglob("*")
        if f.is_file() and any(v in f.read_bytes() for v in values)
    )
    assert holders == ["n1/env", "o1/env"], holders
    assert "_value" not in json.dumps(doc)
    local_agent("stop", "--workdir", str(local_agent.workdir), "--grace", "2")


CHECKPOINTER = (
    'python3 -c "import signal, sys, time\n'
    "def bye(sig, frame):\n"
    "    print('checkpoint saved on', signal.Signals(sig).name, flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGINT, bye)\n"
    "print('training', flush=True)\n"
    'time.sleep(60)"'
)


def test_stop_sigint_checkpoints_and_is_idempotent(local_agent: LocalAgent) -> None:
    rc, doc = launch(local_agent, CHECKPOINTER, "--run-id", "s1")
    assert rc == 0, doc
    run_dir = local_agent.workdir / "runs" / "s1"
    wait_for(lambda: "training" in (run_dir / "train.log").read_text(), 10, what="training")
    rc, doc = local_agent(
        "stop",
        "--workdir",
        str(local_agent.workdir),
        "--grace",
        "20",
        "--by",
        "orch stop by alice@laptop",
    )
    assert rc == 0, doc
    assert doc["stopped"] is True and doc["signals"] == ["SIGINT"], doc
    assert doc["state"] == "exited" and doc["exit_status"] == 0
    assert "checkpoint saved on SIGINT" in (run_dir / "train.log").read_text()
    # The request was written before the first signal, so the end reads as a stop.
    request = json.loads((run_dir / rundir.STOP_REQUEST).read_text())
    assert request == {**doc["stop_requested"]}
    assert request["signal"] == "SIGINT" and request["by"] == "orch stop by alice@laptop"
    assert request["at"] <= (run_dir / "exit_status").stat().st_mtime
    assert rundir.run_state(run_dir).to_dict()["stop_requested"] == request
    # The session and the run directory stay for the postmortem.
    assert session_info(local_agent, "train")["exists"]
    rc, again = local_agent("stop", "--workdir", str(local_agent.workdir), "--grace", "20")
    assert rc == 0 and again["stopped"] is False and again["exit_status"] == 0
    assert json.loads((run_dir / rundir.STOP_REQUEST).read_text()) == request, "not re-asked"


def test_stop_escalates_to_sigkill_after_grace(local_agent: LocalAgent) -> None:
    stubborn = (
        'python3 -c "import signal, time\n'
        "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)\n"
        "print('stubborn', flush=True)\n"
        'time.sleep(60)"'
    )
    rc, doc = launch(local_agent, stubborn, "--run-id", "s2")
    assert rc == 0, doc
    run_dir = local_agent.workdir / "runs" / "s2"
    wait_for(lambda: "stubborn" in (run_dir / "train.log").read_text(), 10, what="start")
    t0 = time.monotonic()
    rc, doc = local_agent("stop", "--workdir", str(local_agent.workdir), "--grace", "1")
    assert rc == 0 and doc["signals"] == ["SIGINT", "SIGTERM", "SIGKILL"], doc
    assert doc["exit_status"] == 137
    assert 1.0 <= time.monotonic() - t0 < 8.0
    # tee survived the signals: the log is complete and the wrapper wrote the status.
    assert (run_dir / "train.log").read_text().startswith("stubborn")


def test_live_session_refused_then_force_keeps_old_run(local_agent: LocalAgent) -> None:
    rc, doc = launch(local_agent, CHECKPOINTER, "--run-id", "old")
    assert rc == 0, doc
    old_dir = local_agent.workdir / "runs" / "old"
    wait_for(lambda: "training" in (old_dir / "train.log").read_text(), 10, what="training")
    rc, doc = launch(local_agent, "echo new", "--run-id", "new")
    assert rc == answer.EXIT_REFUSED and doc["error"] == "session-live", doc
    assert not (local_agent.workdir / "runs" / "new").exists()
    assert rundir.run_state(old_dir).state == "running"

    rc, doc = launch(local_agent, "echo new; sleep 30", "--run-id", "new", "--force")
    assert rc == 0, doc
    assert doc["replaced"]["exit_status"] == 0 and doc["replaced"]["signals"] == ["SIGINT"]
    assert "checkpoint saved" in (old_dir / "train.log").read_text()
    assert "training" in (old_dir / "pane.txt").read_text()
    assert (old_dir / "manifest.json").exists()
    assert (local_agent.workdir / "runs" / "current").read_text().strip() == "new"
    rc, listing = local_agent("runs", "--workdir", str(local_agent.workdir))
    assert [(r["run_id"], r["state"]) for r in listing["runs"]] == [
        ("old", "exited"),
        ("new", "running"),
    ]
    rc, doc = launch(local_agent, "echo again", "--run-id", "new", "--force")
    assert rc == answer.EXIT_REFUSED and doc["error"] == "run-exists"


def test_logs_tail_and_offsets(local_agent: LocalAgent) -> None:
    cmd = "for i in $(seq 1 500); do echo line-$i; done"
    rc, doc = launch(local_agent, cmd, "--run-id", "l1")
    assert wait_for(lambda: exit_status(local_agent, "l1") == 0, 10)
    wd = str(local_agent.workdir)
    rc, doc = local_agent("logs", "--workdir", wd, "-n", "3")
    assert doc["lines"] == ["line-498", "line-499", "line-500"]
    size = doc["offset"]
    rc, doc = local_agent("logs", "--workdir", wd, "--offset", str(size - 18))
    assert doc["lines"] == ["line-499", "line-500"] and doc["offset"] == size
    rc, doc = local_agent("logs", "--workdir", wd, "--offset", str(size + 1000))
    assert doc["truncated"] is True and doc["lines"][0] == "line-1"


def test_logs_follow_ends_after_exit(local_agent: LocalAgent) -> None:
    """Lines arrive while the run writes them: the run prints tick-2.. only once follow has
    delivered tick-1 (a file the test makes then), so no machine is too slow for this."""
    go = local_agent.workdir / "go-on"
    cmd = (
        f"echo tick-1; while [ ! -e {go} ]; do sleep 0.05; done; "
        "for i in 2 3 4; do echo tick-$i; sleep 0.2; done"
    )
    launch(local_agent, cmd, "--run-id", "f1", "--settle", "0")
    from tests.launch.conftest import _DISPATCH

    follow = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _DISPATCH,
            "logs",
            "--workdir",
            str(local_agent.workdir),
            "-f",
            "--offset",
            "0",
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=local_agent.env,
    )
    try:
        assert follow.stdout is not None
        docs = []
        for line in follow.stdout:
            docs.append(json.loads(line))
            if any(d["lines"] for d in docs):
                break
        go.touch()
        docs += [json.loads(x) for x in follow.stdout]
        assert follow.wait(timeout=20) == 0
    finally:
        follow.kill()
        follow.wait()
    lines = [line for d in docs for line in d["lines"]]
    assert lines == ["tick-1", "tick-2", "tick-3", "tick-4"]
    assert len([d for d in docs if d["lines"]]) >= 2, "follow delivered it all at once"
    assert docs[-1]["end"] is True and docs[-1]["state"]["exit_status"] == 0


def test_tail_reads_only_the_end(tmp_path: Path) -> None:
    """A 40 MB log: the tail of 5 lines reads a block or two, not the file."""
    big = tmp_path / "train.log"
    with open(big, "wb") as fh:
        fh.write((b"x" * 99 + b"\n") * 400_000)
        fh.write(b"last-1\nlast-2\npartial")
    t0 = time.perf_counter()
    lines, size = logs.tail_lines(big, 2)
    assert time.perf_counter() - t0 < 0.05
    assert lines == ["last-2", "partial"] and size == big.stat().st_size
    chunk = logs.read_from(big, size - len(b"last-2\npartial"))
    assert chunk["lines"] == ["last-2"] and chunk["offset"] == size - len(b"partial")


def test_answers_stay_bounded_after_a_huge_first_line(local_agent: LocalAgent) -> None:
    """A 16 MB line (no newline for 16 MB) before ``launch`` answers: every answer that
    carries run output stays small and parses on the operator's side (it was 12.4 MB once,
    over ``parse_document``'s 8 MiB, and ``Target.agent`` raised a protocol error)."""
    from orchestrator.remote.target import parse_document

    huge = 16_000_000
    cmd = f"head -c {huge} /dev/zero | tr '\\0' x; echo; echo after-huge"
    res = local_agent.raw(
        "launch",
        "--workdir",
        str(local_agent.workdir),
        "--session",
        "train",
        "--cmd",
        cmd,
        "--no-recorder",
        "--run-id",
        "huge",
        "--settle",
        "20",
    )
    log = local_agent.workdir / "runs" / "huge" / "train.log"
    assert log.stat().st_size > huge, "the huge line never reached the log"
    wd = ["--workdir", str(local_agent.workdir)]
    answers = {
        "launch": res.stdout,
        "runs": local_agent.raw("runs", *wd, "--current", "--tail", "20").stdout,
        "logs": local_agent.raw("logs", *wd, "-n", "20").stdout,
        "logs --offset": local_agent.raw("logs", *wd, "--offset", "0").stdout,
        "evidence": local_agent.raw("evidence", *wd).stdout,
        "stop": local_agent.raw("stop", *wd, "--grace", "2").stdout,
    }
    for what, out in answers.items():
        assert 0 < len(out) < 1 << 20, (what, len(out))
        parse_document("ct", out)  # no AgentProtocolError
    doc = parse_document("ct", answers["launch"])
    assert doc["state"]["state"] == "exited" and doc["state"]["exit_status"] == 0
    assert doc["state"]["log_tail"][-1] == "after-huge"
    # read from the end within MAX_TAIL_BYTES: the line's start is out of reach, and said so
    assert doc["state"]["log_tail"] == [f"…[skipped {huge + 1} bytes]", "after-huge"]
    offset = parse_document("ct", answers["logs --offset"])
    assert offset["lines"][0].endswith("…[cut " + str(logs.MAX_READ_BYTES - 2000) + " bytes]")
    ev = parse_document("ct", answers["evidence"])
    assert ev["log"]["tail"][-1] == "after-huge"
    assert all(len(x.encode()) <= logs.MAX_LINE_BYTES + 30 for x in ev["pane"]["lines"])


def test_tail_window_says_what_it_skipped(tmp_path: Path) -> None:
    """More than ``max_bytes`` inside one line: the tail says how much it skipped, no more."""
    path = tmp_path / "train.log"
    path.write_bytes(b"y" * 300_000 + b"\nlast\n")
    lines, size = logs.tail_lines(path, 5, max_bytes=100_000)
    assert lines == ["…[skipped 300001 bytes]", "last"] and size == 300_006
    lines, _ = logs.tail_lines(path, 1, max_bytes=100_000)
    assert lines == ["last"]
