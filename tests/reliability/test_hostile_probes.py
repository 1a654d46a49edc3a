"""More of the hostile container: deep JSON, C1 and bidi controls, Hydra lists, non-finite
numbers, a broken history database, a revoked host key, secrets in orch.db, a relaunch's
variables. The probes that read the container run on both observation paths (``path``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.sandbox.scenario import load_scenario
from tests.helpers import wait_for
from tests.reliability.conftest import CANARY, PROXIES, ROOT, TRAINER, proxied
from tests.reliability.test_hostile_container import _check, _kinds, path  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RAW = ("\x1b", "\x07", "\x85", "\x9b", "\u202e", "\u2066", "\u200f")
"""Bytes that must never reach a terminal raw: ESC, BEL, C1 (NEL, CSI), bidi overrides."""
C1_BIDI = "\x85\x9b31m\u202eevil\u2066\u200f"


def _raw(outs: dict[str, str]) -> dict[str, list[str]]:
    return {
        k: [repr(c) for c in RAW if c in v] for k, v in outs.items() if any(c in v for c in RAW)
    }


def _ok(res) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in res.stderr and res.returncode != 70, res.stderr[-2000:]


@contextlib.contextmanager
def _edited(fleet, tmp_path: Path, edit: Callable[[dict], None]) -> Iterator[Path]:  # type: ignore[no-untyped-def, type-arg]
    """``fleet.config`` is a copy of hosts.yaml changed by ``edit`` while the block runs."""
    doc = yaml.safe_load(fleet.config.read_text())
    edit(doc)
    config = tmp_path / "edited.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    original, fleet.config = fleet.config, config
    try:
        yield config
    finally:
        fleet.config = original


def _pid_by_comm(comm: bytes) -> int | None:
    """The host PID of a process whose ``/proc/PID/comm`` is ``comm`` (None: none yet)."""
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and (d / "comm").read_bytes() == comm:
                return int(d.name)
    return None


def _strict(text: str) -> object:
    def bad(name: str) -> object:
        raise ValueError(f"non-finite constant {name} in JSON")

    return json.loads(text, parse_constant=bad)


@pytest.mark.fault(
    area="hostile container",
    fault='`"[" * 5000` written by the run into its manifest.json and its metrics.jsonl',
    must="the live run stays running (never idle, never unreachable); `orch runs` and the "
    "postmortem work (no RecursionError, no exit 70); both paths",
)
def test_deep_json_in_manifest_and_metrics_changes_no_verdict(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]  # noqa: F811
    fleet.scenario("idle")
    plant = (
        "python3 -c \"import os; d = os.environ['ORCH_RUN_DIR']; "
        "open(d + '/manifest.json', 'w').write('[' * 5000); "
        "open(d + '/metrics.jsonl', 'w').write('[' * 5000 + chr(10))\"; "
    )
    fleet.agent_launch("ct200", cmd=plant + TRAINER)
    wait_for(lambda: "step=3 " in (fleet.run_dir("ct200") / "train.log").read_text(), 30)
    assert (fleet.run_dir("ct200") / "manifest.json").read_text().startswith("[" * 100)
    rc, t, _ = _check(fleet, tmp_path)
    runs = fleet.orch("runs", "ct200")
    _ok(runs)
    fleet.kill_trainer("ct200")
    wait_for(lambda: (fleet.run_dir("ct200") / "exit_status").exists(), 20)
    pm = fleet.orch("postmortem", "ct200", "--out", str(tmp_path / "pm"))
    observe(
        f"{path} path: check exit {rc}, state {t['state']!r}, reachable {t['reachable']}, "
        f"{_kinds(t)}; runs exit {runs.returncode}; postmortem exit {pm.returncode}"
    )
    _ok(pm)
    assert t["reachable"] and t["state"] in ("running", "starting"), t
    assert runs.returncode == 0 and pm.returncode in (0, 1, 2), (runs.stderr, pm.stderr)
    assert list((tmp_path / "pm").rglob("report.md")), pm.stdout


@pytest.mark.fault(
    area="hostile container",
    fault="C1 controls (NEL, CSI) and bidi overrides (U+202E, U+2066, U+200F) in a log line, "
    "the run id (`runs/current`) and the name of a process of the run; a log line of three "
    "backticks",
    must="no C1 or bidi character on stdout of check, status, runs, watch --plain or the "
    "postmortem; report.md and report.html show them escaped; the backticks do not close "
    "report.md's code fence; both paths",
)
def test_c1_and_bidi_never_reach_the_terminal_or_the_report(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]  # noqa: F811
    fleet.scenario("idle")
    evil_id = "r" + C1_BIDI
    name = "py" + C1_BIDI
    cmd = (
        f"printf '%s\\n' 'step=1 loss=2.0 {C1_BIDI}' '```' 'after the fence'; "
        f'exec -a x python3 -c "import ctypes, time; ctypes.CDLL(None).prctl(15, {name.encode()[:15]!r}); '
        'time.sleep(600)"'
    )
    fleet.agent_launch("ct200", cmd=cmd)
    run = fleet.run_dir("ct200")
    wait_for(lambda: "after the fence" in (run / "train.log").read_text(), 20)
    # the renamed process holds GPU 0 (the fake driver lists it by host PID)
    comm = name.encode()[:15] + b"\n"
    pid = wait_for(lambda: _pid_by_comm(comm), 20, what="the renamed process")
    _, doc = load_scenario("idle")
    doc["devices"][0]["processes"] = [{"pid": pid, "used_mib": 1024}]
    fleet.scenario(doc)
    outs = {"check": _check(fleet, tmp_path)[2]}
    # the container names its current run: a directory whose name is the hostile id
    evil = run.parent / evil_id
    evil.mkdir(exist_ok=True)
    for f in ("manifest.json", "train.log"):
        (evil / f).write_bytes((run / f).read_bytes())
    (run.parent / "current").write_text(evil_id + "\n")
    try:
        outs["check (run id)"] = _check(fleet, tmp_path / "id")[2]
        for args in (("status", "ct200"), ("runs", "ct200"), ("snapshot", "ct200")):
            res = fleet.orch(*args)
            _ok(res)
            outs[args[0]] = res.stdout
        w = fleet.watch("ct200")
        try:
            outs["watch"] = w.wait_line(lambda line: " ct200 " in line, 30)[1]
        finally:
            w.stop()
    finally:
        (run.parent / "current").write_text(run.name + "\n")
    fleet.kill_trainer("ct200")
    wait_for(lambda: (run / "exit_status").exists(), 20)
    res = fleet.orch("postmortem", "ct200", "--out", str(tmp_path / "pm"))
    _ok(res)
    outs["postmortem"] = res.stdout
    md = next((tmp_path / "pm").rglob("report.md")).read_text()
    outs["report.md"] = md
    outs["report.html"] = next((tmp_path / "pm").rglob("report.html")).read_text()
    bad = _raw(outs)
    # the log's fence: the line of three backticks sits inside a longer fence
    tick = next((i for i, line in enumerate(md.splitlines()) if line == "```"), None)
    opener = next(
        (line for line in md.splitlines()[: tick or 0][::-1] if re.fullmatch(r"`{3,}\w*", line)), ""
    )
    shown = [k for k in ("status", "runs", "check", "snapshot") if "evil" in outs[k]]
    observe(
        f"{path} path: raw C1/bidi on {sorted(bad) or 'no output'}; the hostile run id or "
        f"GPU process name shown (escaped) by {shown}; the ``` log line "
        f"{'inside a ' + str(len(opener.rstrip('abcdefghijklmnopqrstuvwxyz'))) + '-tick fence' if tick is not None else 'not in report.md'}"
    )
    assert not bad, bad
    assert "\\u202e" in md or "\\u202E" in md, md[-1500:]
    assert tick is not None and len(re.match(r"`*", opener).group()) > 3, md[-1500:]  # type: ignore[union-attr]


@pytest.mark.fault(
    area="hostile container",
    fault="a Hydra-style list `[a,b]` (and `[bold]`) in a launch command",
    must="`orch runs` prints the command as written (no rich MarkupError, no exit 70)",
)
def test_a_hydra_list_in_a_command_is_printed_not_parsed(fleet, observe):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    fleet.agent_launch(
        "ct200", cmd="echo model.layers=[a,b] tag=[bold]x[/bold] step=1 loss=2.0; sleep 600"
    )
    res = fleet.orch("runs", "ct200")
    json_res = fleet.orch("runs", "ct200", "--json")
    observe(
        f"runs exit {res.returncode}, shows [a,b]: {'[a,b]' in res.stdout}, "
        f"[bold] kept: {'[bold]' in res.stdout}; --json exit {json_res.returncode}"
    )
    _ok(res)
    assert res.returncode == 0 and "[a,b]" in res.stdout, res.stdout[-1500:]
    assert json_res.returncode == 0 and "[a,b]" in json_res.stdout


@pytest.mark.fault(
    area="hostile container",
    fault="non-finite numbers from the run: `loss=nan` and `loss=inf` log lines, metrics.jsonl "
    "records with NaN and Infinity",
    must="`orch snapshot --json` and `orch check --json` print valid JSON (no bare NaN or "
    "Infinity: json.loads with parse_constant raising accepts it)",
)
def test_non_finite_values_still_make_valid_json(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("healthy")
    now = time.time()
    recs = f'{{"time": {now}, "step": 1, "loss": NaN, "tok_s": Infinity}}\\n{{"time": {now}, "step": 2, "loss": -Infinity}}'
    fleet.agent_launch(
        "ct200",
        cmd=f"printf '{recs}\\n' > \"$ORCH_RUN_DIR/metrics.jsonl\"; "
        "echo step=1 loss=nan tok/s=inf; echo step=2 loss=inf; sleep 600",
    )
    wait_for(lambda: "step=2" in (fleet.run_dir("ct200") / "train.log").read_text(), 20)
    got = {}
    for args in (
        ("snapshot", "ct200", "--json"),
        ("check", "ct200", "--json", "--db", str(tmp_path / "orch.db")),
    ):
        res = fleet.orch(*args)
        _ok(res)
        try:
            _strict(res.stdout)
            got[args[0]] = f"exit {res.returncode}, valid JSON"
        except ValueError as exc:
            got[args[0]] = f"exit {res.returncode}, INVALID: {exc}"
    observe("; ".join(f"{k} --json: {v}" for k, v in got.items()))
    assert all(v.endswith("valid JSON") for v in got.values()), got


@pytest.mark.fault(
    area="history",
    fault="the history database (orch.db) corrupt (garbage bytes), or locked by `BEGIN "
    "EXCLUSIVE` in another process",
    must="`orch check` exits 3 (UNKNOWN) naming the file, no traceback; the locked one "
    "within its deadline",
)
def test_a_broken_history_database_is_unknown_naming_the_file(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    fleet.agent_launch("ct200")
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\0" + b"\xde\xad" * 4096)
    t0 = time.monotonic()
    bad = fleet.orch("check", "ct200", "--db", str(corrupt))
    took_bad = time.monotonic() - t0
    locked = tmp_path / "locked.db"
    assert fleet.orch("check", "ct200", "--db", str(locked)).returncode in (0, 1)
    holder = sqlite3.connect(str(locked), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        res = fleet.orch("check", "ct200", "--db", str(locked), timeout_s=180)
        took = time.monotonic() - t0
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    def said(r) -> str:  # type: ignore[no-untyped-def]
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ".db" in ln]
        return lines[-1].replace(str(tmp_path), "TMP")[:110] if lines else ""

    observe(
        f"corrupt: exit {bad.returncode} in {took_bad:.1f} s, {said(bad)!r}; "
        f"locked: exit {res.returncode} in {took:.1f} s, {said(res)!r}"
    )
    for r, db in ((bad, corrupt), (res, locked)):
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.returncode == 3 and str(db) in r.stderr + r.stdout, (r.returncode, r.stderr)
    assert took < 60, took


@pytest.mark.fault(
    area="security",
    fault="the sandbox sshd's host key marked `@revoked` in known_hosts (after an unmarked "
    "line that accepts it)",
    must="the connection is refused with a clear message naming the revoked key and the file "
    "line, exit 3, no traceback (OpenSSH refuses it too)",
)
def test_a_revoked_host_key_is_refused(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    line = Path(fleet.info.known_hosts_path).read_text().strip().splitlines()[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"{line}\n@revoked * {line.split(None, 1)[1]}\n")
    with _edited(fleet, tmp_path, lambda d: d["hosts"]["sandbox"].update(known_hosts=str(known))):
        res = fleet.orch("check", "ct200", "--db", str(tmp_path / "orch.db"))
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if "REVOKED" in ln]
    shown = said[0][said[0].find("unreachable since") :] if said else "no REVOKED message"
    shown = re.sub(r"since \S+", "since T", shown.replace(str(tmp_path), "TMP"))
    observe(f"check exit {res.returncode}: {shown[:200]!r}")
    assert "Traceback" not in res.stderr and res.returncode == 3, res.stderr[-2000:]
    assert said and "line 2" in said[0], res.stdout + res.stderr


@pytest.mark.fault(
    area="security",
    fault=f"a run that prints its hosts.yaml secret (HF_TOKEN={CANARY}-db) in its log, "
    "checked three times",
    must="the value never appears in orch.db (its stored log lines are redacted like every "
    "other artefact)",
)
def test_orch_db_holds_no_secret_the_log_printed(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    secret = CANARY + "-db"
    fleet.scenario("idle")
    db = tmp_path / "orch.db"
    with _edited(
        fleet, tmp_path, lambda d: d["containers"]["ct201"].update(env={"HF_TOKEN": secret})
    ):
        launched = fleet.orch(
            "launch",
            "ct201",
            "--cmd",
            "i=0; while true; do i=$((i+1)); echo "
            '"step=$i loss=2.0 token=$HF_TOKEN"; echo "RuntimeError: auth '
            'failed for $HF_TOKEN"; sleep 0.5; done',
            "--force",
            "--grace",
            "2",
            "--no-verify",
        )
        assert launched.returncode == 0, launched.stderr[-2000:]
        run = fleet.run_dir("ct201")
        wait_for(lambda: secret in (run / "train.log").read_text(), 20, what="the printed secret")
        for _ in range(3):
            fleet.orch("check", "ct201", "--db", str(db))
        fleet.kill_trainer("ct201")
        wait_for(lambda: (run / "exit_status").exists(), 20)
        fleet.orch("check", "ct201", "--db", str(db))
    files = [p for p in tmp_path.iterdir() if p.name.startswith("orch.db")]
    leaks = [p.name for p in files if secret.encode() in p.read_bytes()]
    with sqlite3.connect(str(db)) as con:
        dump = "\n".join(con.iterdump())
    observe(
        f"orch.db ({sum(p.stat().st_size for p in files)} bytes, {len(dump)} chars dumped): "
        f"value found in {leaks or 'none'}; redaction mark present: {'***' in dump or 'REDACTED' in dump}"
    )
    assert not leaks and secret not in dump, leaks


HEAL_SECRET = CANARY + "-heal"
HEAL_CMD = (
    'echo "tok=$(printf %s "$SECRET_TOKEN" | sha256sum | cut -c1-16) lr=$LR '
    'resume=$ORCH_RESUME"; i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0"; '
    'sleep 0.5; [ -z "$ORCH_RESUME" ] && [ "$i" -ge 4 ] && exit 3; done'
)


@pytest.mark.fault(
    area="self-healing",
    fault=f"a run launched with `--env SECRET_TOKEN={HEAL_SECRET} --env LR=3e-4` exits 3; "
    "`orch check --heal` relaunches it",
    must="the relaunched run has the run's variables (it prints the secret's hash and LR) from "
    "the 0600 env file, plus ORCH_RESUME",
)
def test_a_heal_relaunch_keeps_the_runs_variables(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    def heal(doc: dict) -> None:  # type: ignore[type-arg]
        doc["defaults"]["thresholds"]["startup_timeout_s"] = 30
        doc["defaults"]["restart"] = {
            "max": 3,
            "window": "1h",
            "backoff": [1],
            "retry_unknown": True,
            "settle_timeout": "60s",
        }

    fleet.scenario("idle")
    db = tmp_path / "orch.db"
    with _edited(fleet, tmp_path, heal):
        res = fleet.orch(
            "launch",
            "ct200",
            "--cmd",
            HEAL_CMD,
            "--env",
            f"SECRET_TOKEN={HEAL_SECRET}",
            "--env",
            "LR=3e-4",
            "--force",
            "--grace",
            "2",
            "--no-verify",
        )
        assert res.returncode == 0, res.stderr[-2000:]
        first = fleet.run_dir("ct200")
        wait_for(lambda: (first / "exit_status").exists(), 30, what="the first run to exit 3")
        deadline, heals = time.monotonic() + 120, []
        while fleet.run_dir("ct200") == first and time.monotonic() < deadline:
            heal = fleet.orch("check", "ct200", "--heal", "--db", str(db))
            heals += [ln for ln in heal.stdout.splitlines() if "HEAL" in ln]
            time.sleep(1)
        second = fleet.run_dir("ct200")
        assert second != first, heals
        wait_for(lambda: "resume=" in (second / "train.log").read_text(), 30, what="the relaunch")
    want = hashlib.sha256(HEAL_SECRET.encode()).hexdigest()[:16]
    line = next(ln for ln in (second / "train.log").read_text().splitlines() if "resume=" in ln)
    observe(
        f"relaunched as {second.name} after {heals[-1][:80] if heals else 'no HEAL line'!r}; "
        f"it printed {line.replace(want, '<hash of the secret>')!r}"
    )
    assert f"tok={want} lr=3e-4 resume=" in line and not line.endswith("resume="), line


@pytest.mark.fault(
    area="transport",
    fault="the SSH connection cut just after the agent started the run (the run stops the "
    "agent before it answers, then the TCP proxy in front of sshd is killed)",
    must="`orch launch` exits 3 saying the run may have started and how to check (no "
    "'unreachable', no bootstrap script); the run is in fact running",
)
def test_a_cut_after_the_start_says_the_run_may_have_started(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    if fleet.info.isolation != "lxc":
        pytest.skip("the run finds the agent by its command line in its own PID namespace")
    with proxied(fleet, tmp_path / "cut.yaml", delay_ms=1) as config:
        fleet.scenario("idle")
        # the run's first act: stop the agent that launched it (before its answer), say its PID
        stop = (
            'p=$(pgrep -f -- "--env-stdin" | head -n 1); kill -STOP $p; '
            'echo $p > "$ORCH_RUN_DIR/agent.pid.tmp"; mv "$ORCH_RUN_DIR/agent.pid.tmp" '
            '"$ORCH_RUN_DIR/agent.pid"; '
        )
        launch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "-c",
                str(config),
                "launch",
                "ct200",
                "--cmd",
                stop + TRAINER,
                "--force",
                "--grace",
                "2",
                "--no-verify",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        runs = fleet.info.workdir("ct200") / "runs"

        def stopped() -> bool:
            cur = (runs / "current").read_text().strip() if (runs / "current").exists() else ""
            return bool(cur) and (runs / cur / "agent.pid").exists()

        try:
            wait_for(stopped, 60, 0.05, what="the run to stop its agent")
        except AssertionError:
            launch.kill()
            raise
        agent_pid = int((fleet.run_dir("ct200") / "agent.pid").read_text().split()[0])
        PROXIES[config].terminate()  # the cut: every byte in flight is lost
    try:
        out, err = launch.communicate(timeout=120)
    finally:
        fleet.info.kill("ct200", agent_pid, signal.SIGCONT)
    run = fleet.run_dir("ct200")
    wait_for(lambda: "step=3 " in (run / "train.log").read_text(), 30, what="the run's steps")
    said = [ln for ln in err.splitlines() if "may have started" in ln]
    observe(
        f"launch exit {launch.returncode}: {said[0][:150] if said else err.strip()[-150:]!r}; "
        f"the run {run.name} goes on (step=3 logged)"
    )
    assert launch.returncode == 3 and said, (launch.returncode, out[-1000:], err[-2000:])
    assert "orch status ct200" in said[0] and "unreachable" not in err, err[-2000:]
    assert "import " not in err and "Traceback" not in err, err[-2000:]
