"""The contract between the bundled trainer (docs/trainer.md) and orch's monitor, end to end.

Part 1 (pure, no sandbox): the lines a real short CPU run of ``python -m trainer`` prints parse
with the agent's :class:`~orchestrator.agent.metrics.MetricParser` to the same numbers the
trainer's own parser reads, and its ``loss=nan`` line is what the ``nan-loss`` playbook matches.

Part 2 (``e2e``, through the sandbox: real sshd, ``pct exec`` stand-in, tmux): ``orch launch``
of the bundled trainer with its default command, then every ``--fault`` the trainer offers and
what orch's monitor says about it (``orch check --json``, ``orch postmortem --json``, and the
``orch watch`` path: :meth:`Target.stream` plus the detectors).

The ``crash`` run goes through launch's pass-through (``orch launch f-crash -- --steps 400
--fault crash@4 ...``: the default command plus extra trainer arguments). The others use
``--cmd`` with the deployed trainer bundle (``bundle.trainer_bundle()`` through
``deploy.ensure_agent``) and ``--run-dir "$ORCH_RUN_DIR"`` (the wrapper's variable), so the
trainer's heartbeat and metrics.jsonl land in orch's run directory as with the default command;
``--cmd`` skips preflight's torch import, which on a loaded 2-core box costs tens of seconds a
launch. ``gpu-default`` (GPUs assigned, no ``trainer_config``) is only launched to be refused:
the sandbox's torch sees no CUDA device, so the default ``dflash-8gpu`` could never run.

Every fault run is its own target in a copy of the sandbox's hosts.yaml: the same container
(vmid) under another name, with its own workdir and tmux session, so the runs go in parallel
and never touch the ``train`` session or workdir other test areas use. Small thresholds
(``stall_timeout_s`` ...) keep the whole file to a few minutes on a loaded 2-core box.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.agent.metrics import MetricParser
from orchestrator.cli import run as orch_run
from orchestrator.monitor import observe
from orchestrator.playbooks.loader import load_playbooks, match_log
from orchestrator.wire.model import Finding, Snapshot
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trainer.md"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.yaml"
SESSION = "contract"

# Short thresholds for the test inventory (seconds; see orchestrator/config/limits.py).
THRESHOLDS: dict[str, Any] = {
    "stall_timeout_s": 8,
    "throughput_samples": 3,
    "throughput_drop_ratio": 0.5,
    "throughput_baseline_samples": 10,
    "startup_grace_s": 3600,  # no "not allocating" noise: the CPU trainer holds no GPU memory
    "startup_timeout_s": 150,  # importing torch takes tens of seconds on a loaded 2-core box
}

# One run per fault, each its own target; the drift run carries slow, nan and hang in order:
# a baseline, then ~8x slower steps, then NaN loss, then a hang. The throughput-drop detector
# needs 3 distinct 1 Hz readings of slow steps: 24 of them last ~5 s even on a quiet machine.
SLOW_AT, NAN_AT, HANG_AT = 40, 64, 72
FAULT_RUNS: dict[str, list[str]] = {
    "crash": ["crash@4"],
    "oom": ["oom@4"],
    "silent": ["silent-exit@4"],
    "drift": [f"slow@{SLOW_AT}:8", f"nan@{NAN_AT}", f"hang@{HANG_AT}"],
}
FAULT_STEPS = 400  # never reached: every fault run ends (or hangs) well before
PASS_THROUGH = {"crash"}  # launched as `orch launch f-crash -- --steps ... --fault crash@4`


# --- part 1: the log line contract, pure ------------------------------------------------------


def _trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclass(frozen=True)
class TrainerRun:
    """A finished short CPU run: its stdout lines, stderr, exit code and run directory."""

    stdout: list[str]
    stderr: str
    returncode: int
    run_dir: Path


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> TrainerRun:
    """``python -m trainer`` on tiny-cpu: 8 steps, a metrics line every step, tau measured at
    steps 4 and 8, a NaN gradient at step 6 (skipped)."""
    run_dir = tmp_path_factory.mktemp("contract-run") / "run"
    argv = [
        sys.executable,
        "-m",
        "trainer",
        "--config",
        str(TINY),
        "--run-dir",
        str(run_dir),
        "--steps",
        "8",
        "--set",
        "train.log_every=1",
        "--set",
        "train.eval_every=4",
        "--fault",
        "nan@6",
    ]
    res = subprocess.run(
        argv, cwd=ROOT, env=_trainer_env(), capture_output=True, text=True, timeout=150, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return TrainerRun(res.stdout.splitlines(), res.stderr, res.returncode, run_dir)


def _metric_lines(lines: list[str]) -> list[str]:
    from trainer.metrics import LINE_RE

    return [x for x in lines if LINE_RE.match(x)]


def test_every_real_metrics_line_parses_with_the_agent_parser(short_run: TrainerRun) -> None:
    from trainer.metrics import parse_line

    lines = _metric_lines(short_run.stdout)
    assert len(lines) == 8, short_run.stdout
    parser = MetricParser()
    records = [
        json.loads(x) for x in (short_run.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == list(range(1, 9))
    for line, rec in zip(lines, records, strict=True):
        ours = parse_line(line)  # the trainer's own reading of its line
        assert ours is not None, line
        m = parser.parse([line], now=1.0)
        assert m is not None, line
        assert m.step == ours["step"] == rec["step"], line
        assert m.tokens_per_s == float(ours["tok_s"]) == round(rec["tok_s"]), line
        assert m.acc_len is None, line  # the proxy is tau_tf now, not read as acc_len
        if rec["step"] % 4:
            assert m.tau is None and ours["tau"] is None and rec["tau"] is None, line
        else:
            assert m.tau == ours["tau"] == pytest.approx(rec["tau"], abs=5e-3), line
            assert 1.0 <= m.tau <= 4.0, line
        if rec["loss"] is None:
            assert m.loss is not None and math.isnan(m.loss), line
        else:
            assert m.loss == pytest.approx(rec["loss"], abs=5e-5), line


def test_the_documented_example_line_parses() -> None:
    text = DOC.read_text()
    example = re.search(
        r"^step=\d+ loss=\S+ tau=\S+ tau_tf=\S+ tok/s=\d+ lr=\S+ gpu_mem=\S+$", text, re.M
    )
    assert example is not None, "docs/trainer.md lost its metrics line example"
    m = MetricParser().parse([example.group(0)], now=0.0)
    assert m is not None
    assert (m.step, m.loss, m.tau, m.tokens_per_s) == (120, 2.3104, 2.31, 21500.0)
    # the agent's newest-wins merge: the line after a banner still wins
    assert (
        MetricParser()
        .parse(["trainer: warm-up cpu forward+backward 0.05s", example.group(0)], now=0.0)
        .step
        == 120
    )


def test_banner_lines_carry_no_metric(short_run: TrainerRun) -> None:
    """No startup line may read as a step, loss, tok/s, acc_len or tau (``steps=``, the config
    JSON, the ``tau = greedy draft-and-verify ...`` line)."""
    banner = [x for x in short_run.stdout if x.startswith("trainer: ") and "finished" not in x]
    assert any(x.startswith("trainer: config {") for x in banner)
    parser = MetricParser()
    for line in banner:
        assert parser.parse([line], now=0.0) is None, line


def test_finished_line_keeps_the_last_step(short_run: TrainerRun) -> None:
    """The end line says the final step; the agent reads it as step 8 and the run's mean tok/s."""
    last = short_run.stdout[-1]
    assert last.startswith("trainer: finished step=8 "), last
    m = MetricParser().parse(short_run.stdout, now=0.0)
    assert m is not None and m.step == 8
    mean = re.search(r"tok/s=(\d+)", last)
    assert mean is not None and m.tokens_per_s == float(mean.group(1))


def test_nan_loss_line_parses_as_nan_and_matches_the_nan_loss_playbook(
    short_run: TrainerRun,
) -> None:
    from orchestrator.wire.progress import read_line

    nan_lines = [x for x in _metric_lines(short_run.stdout) if " loss=nan " in x]
    assert [int(x.split()[0].removeprefix("step=")) for x in nan_lines] == [6]  # then skipped
    m = MetricParser().parse([nan_lines[0]], now=0.0)
    assert m is not None and m.loss is not None and math.isnan(m.loss)
    reading = read_line(nan_lines[0])
    assert reading is not None and reading.loss is not None and math.isnan(reading.loss)
    matches = match_log(short_run.stdout, load_playbooks())
    assert matches and matches[0].id == "nan-loss", [x.id for x in matches]
    assert matches[0].line.strip() == nan_lines[0]


# --- part 2: through the sandbox --------------------------------------------------------------


@pytest.fixture(scope="module")
def contract_config(sandbox: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox's hosts.yaml, private workdirs and sessions, short thresholds, no GPUs.

    ``ct200``: the sandbox container, no GPUs assigned (the CPU trainer uses none, and the
    default config for a container without GPUs is ``tiny-cpu``). One more target per fault
    run (``f-crash``...) on the sandbox's containers, each with its own workdir and session.
    """
    doc = yaml.safe_load(Path(sandbox.config_path).read_text())
    base = doc["containers"]
    vmids = [c["vmid"] for c in base.values()]
    containers: dict[str, Any] = {}
    for i, name in enumerate(["ct200", *(f"f-{k}" for k in FAULT_RUNS), "gpu-default"]):
        src = base[f"ct{vmids[i % len(vmids)]}"]
        containers[name] = {
            "host": src["host"],
            "vmid": src["vmid"],
            "workdir": f"{src['workdir']}-{SESSION}-{name}",
            "session": f"{SESSION}-{name}",
            "python": src.get("python", "python3"),  # an LXC sandbox names the operator's
            "thresholds": dict(THRESHOLDS),
            "poll_interval": 1,
        }
    containers["gpu-default"]["gpus"] = base[f"ct{vmids[0]}"].get("gpus") or {"all": "0-7"}
    doc["containers"] = containers
    path = tmp_path_factory.mktemp("contract") / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def orch(
    contract_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[int, str]]:
    """``orch -c CONFIG ARGS`` in-process: (exit code, stdout). Own history db and state dir."""
    db = tmp_path_factory.mktemp("contract-db") / "orch.db"
    state = tmp_path_factory.mktemp("contract-state")
    lock = threading.Lock()

    def call(*args: str) -> tuple[int, str]:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with (
            lock,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            pytest.MonkeyPatch.context() as mp,
        ):
            mp.setenv("ORCH_DB", str(db))
            mp.setenv("XDG_STATE_HOME", str(state))
            code = orch_run(["-c", str(contract_config), *args])
        return code, out.getvalue() + (f"\n[stderr]\n{err.getvalue()}" if code else "")

    return call


def _inventory(path: Path) -> Any:
    from orchestrator.config.inventory import load_inventory

    return load_inventory(path)


def fault_command(inventory: Any, name: str, faults: list[str]) -> str:
    """The bundled trainer (deployed to ``name``) with ``faults``, into orch's run directory."""
    from orchestrator.lifecycle import bundle
    from orchestrator.remote import deploy
    from orchestrator.remote.target import Target
    from orchestrator.wire.quoting import command_line, with_env

    tgt = Target(inventory, name)
    c = tgt.container
    bundle_dir = deploy.ensure_agent(
        tgt.transport, c.workdir, c.python, bundle=bundle.trainer_bundle()
    )
    argv = [
        c.python,
        "-m",
        "trainer",
        "--config",
        f"{bundle_dir}/trainer/configs/tiny-cpu.yaml",
        "--steps",
        str(FAULT_STEPS),
        "--set",
        "train.log_every=1",
    ]
    for f in faults:
        argv += ["--fault", f]
    # $ORCH_RUN_DIR is expanded by the wrapper's shell: the run directory orch made for this run
    return command_line(with_env(argv, {"PYTHONPATH": bundle_dir})) + ' --run-dir "$ORCH_RUN_DIR"'


@dataclass
class Observer:
    """The ``orch watch`` path for one target: ``Target.stream`` in a thread, the detectors run
    over the growing history after every snapshot; each finding is kept with whether a metrics
    line had been seen by then (``stepped``)."""

    target: Any
    history: list[Snapshot] = field(default_factory=list)
    found: list[tuple[bool, Finding]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        from orchestrator.detect.engine import run_detectors

        c = self.target.container
        stepped = False
        try:
            for snap in observe.stream(self.target, 1.0):
                self.history.append(snap)
                stepped = stepped or (snap.metrics is not None and snap.metrics.step is not None)
                for f in run_detectors(self.history, limits=c.limits, now=snap.taken_at):
                    self.found.append((stepped, f))
                if self.stop.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the test that waits on it
            self.error = exc

    def first(self, key: str, pred: Callable[[Finding], bool] = lambda f: True) -> Finding | None:
        """The first finding of ``key`` (``kind`` or ``log-signature:PLAYBOOK``) matching ``pred``."""
        for _, f in list(self.found):
            k = f.kind if f.kind != "log-signature" else f"log-signature:{f.playbook}"
            if k == key and pred(f):
                return f
        return None


@dataclass
class FaultRuns:
    inventory: Any
    launched: dict[str, dict[str, Any]]
    drift: Observer


@pytest.fixture(scope="module")
def fault_runs(
    contract_config: Path, orch: Callable[..., tuple[int, str]], sandbox: Any
) -> Iterator[FaultRuns]:
    """Start every fault run at once (``--no-verify``), and watch the drift run's stream."""
    from orchestrator.remote.target import Target

    inventory = _inventory(contract_config)
    launched: dict[str, dict[str, Any]] = {}
    for key, faults in FAULT_RUNS.items():
        name = f"f-{key}"
        if key in PASS_THROUGH:
            extra = ["--steps", str(FAULT_STEPS), "--set", "train.log_every=1"]
            for f in faults:
                extra += ["--fault", f]
            code, out = orch("launch", name, "--name", key, "--no-verify", "--json", "--", *extra)
        else:
            cmd = fault_command(inventory, name, faults)
            code, out = orch("launch", name, "--cmd", cmd, "--name", key, "--no-verify", "--json")
        assert code == 0, out
        launched[key] = json.loads(out)
    drift = Observer(Target(inventory, "f-drift"))
    thread = threading.Thread(target=drift.run, name="contract-drift-stream", daemon=True)
    thread.start()
    try:
        yield FaultRuns(inventory, launched, drift)
    finally:
        drift.stop.set()
        for key in FAULT_RUNS:
            orch("stop", f"f-{key}", "--grace", "4")
        thread.join(timeout=30)


def _check(orch: Callable[..., tuple[int, str]], name: str) -> tuple[int, dict[str, Any]]:
    code, out = orch("check", name, "--json", "--critical", "none", "--timeout", "60")
    doc = json.loads(out.split("\n[stderr]\n")[0])
    return code, doc


def _findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for t in doc["targets"] for f in t["findings"]]


def _host(sandbox: Any, inventory: Any, name: str, path: str) -> Path:
    """A path orch reported for target ``name`` (inside its container) as the host reads it."""
    return Path(sandbox.host_path(inventory.container(name).vmid, path))


def _exited(sandbox: Any, fr: FaultRuns, key: str, timeout_s: float = 150.0) -> int:
    run_dir = _host(sandbox, fr.inventory, f"f-{key}", fr.launched[key]["run_dir"])

    def status() -> str | None:
        p = run_dir / "exit_status"
        return p.read_text().strip() if p.exists() else None

    return int(wait_for(status, timeout_s, 0.5, f"{key} run to exit ({run_dir})"))


def _postmortem(orch: Callable[..., tuple[int, str]], name: str, tmp: Path) -> dict[str, Any]:
    code, out = orch("postmortem", name, "--json", "--out", str(tmp / f"pm-{name}"))
    assert code == 0, out
    return json.loads(out)


@pytest.mark.e2e
def test_launch_default_bundled_trainer_is_verified_and_snapshot_reads_its_log(
    orch: Callable[..., tuple[int, str]],
    contract_config: Path,
    fault_runs: FaultRuns,
    sandbox: Any,
) -> None:
    from orchestrator.remote.target import Target

    code, out = orch("launch", "ct200", "--name", "default", "--json")
    try:
        assert code == 0, out
        doc = json.loads(out)
        assert doc["verified"] is True
        assert [p["phase"] for p in doc["phases"] if p["status"] == "ok"] == [
            "preflight",
            "deploy",
            "start",
            "verify",
        ]
        # the default choice for a container without GPUs: the bundled tiny-cpu config
        assert "-m trainer --config " in doc["command"]
        assert (
            doc["command"]
            .split("--config ")[1]
            .split()[0]
            .endswith("/trainer/configs/tiny-cpu.yaml")
        )
        assert f"--run-dir {doc['run_dir']}" in doc["command"]
        tgt = Target(_inventory(contract_config), "ct200")

        def stepped() -> Snapshot | None:
            s = tgt.snapshot()
            return s if s.metrics is not None and s.metrics.step else None

        snap = wait_for(stepped, 90, 0.5, "a metrics line from the default run")
        assert snap.run is not None and snap.run.run_id == doc["run_id"]
        assert snap.metrics is not None
        step, tok_s = snap.metrics.step, snap.metrics.tokens_per_s
        assert step is not None and step % 10 == 0, "tiny-cpu logs every 10 steps"
        assert tok_s is not None and tok_s > 0
        inv = _inventory(contract_config)
        logged = [
            x
            for x in _host(sandbox, inv, "ct200", doc["log_path"]).read_text().splitlines()
            if x.startswith(f"step={step} ")
        ]
        assert logged and f"tok/s={int(tok_s)} " in logged[0], (logged, tok_s)
        assert snap.metrics.loss is not None and 0 < snap.metrics.loss < 10
        # the trainer's heartbeat, in orch's run directory, beats every step
        assert snap.run.heartbeat_age_s is not None and snap.run.heartbeat_age_s < 10
        beat = (_host(sandbox, inv, "ct200", doc["run_dir"]) / "heartbeat").read_text().split()
        assert int(beat[0]) >= step
    finally:
        orch("stop", "ct200", "--grace", "4")


@pytest.mark.e2e
def test_crash_is_critical_crashed_and_postmortem_names_the_traceback(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns, sandbox: Any, tmp_path: Path
) -> None:
    assert _exited(sandbox, fault_runs, "crash") == 1
    # launched through the pass-through: orch's default command, then the extra args, quoted
    command = fault_runs.launched["crash"]["command"]
    assert command.split("--config ")[1].split()[0].endswith("/trainer/configs/tiny-cpu.yaml")
    run_dir = fault_runs.launched["crash"]["run_dir"]
    assert command.endswith(
        f"--run-dir {run_dir} --steps {FAULT_STEPS} --set train.log_every=1 --fault crash@4"
    ), command
    code, doc = _check(orch, "f-crash")
    crashed = [f for f in _findings(doc) if f["kind"] == "crashed"]
    assert code == 2 and doc["status"] == "CRITICAL", doc
    assert crashed and crashed[0]["severity"] == "critical", _findings(doc)
    assert "exit status 1" in crashed[0]["summary"]
    assert any("RuntimeError: injected fault: crash at step 4" in e for e in crashed[0]["evidence"])
    pm = _postmortem(orch, "f-crash", tmp_path)
    v = pm["verdict"]
    assert v["kind"] == "crashed" and v["severity"] == "critical", v
    text = json.dumps(v)
    assert "RuntimeError: injected fault: crash at step 4" in text, v


@pytest.mark.e2e
def test_oom_postmortem_verdict_is_the_cuda_oom_playbook(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns, sandbox: Any, tmp_path: Path
) -> None:
    assert _exited(sandbox, fault_runs, "oom") == 1
    code, doc = _check(orch, "f-oom")
    kinds = {(f["kind"], f["playbook"]) for f in _findings(doc)}
    assert code == 2 and ("log-signature", "cuda-oom") in kinds, kinds
    pm = _postmortem(orch, "f-oom", tmp_path)
    v = pm["verdict"]
    assert (v["kind"], v["playbook"]) == ("log-signature", "cuda-oom"), v
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in " ".join(v["evidence"])
    assert v["remedy"], v


def _silent_facts(fr: FaultRuns, sandbox: Any) -> tuple[int, list[str]]:
    code = _exited(sandbox, fr, "silent")
    log = _host(sandbox, fr.inventory, "f-silent", fr.launched["silent"]["log_path"])
    return code, log.read_text().splitlines()


@pytest.mark.e2e
def test_silent_exit_warns_that_the_trainer_never_printed_its_final_line(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns, sandbox: Any, tmp_path: Path
) -> None:
    """``silent-exit@4``: exit 0 but no ``trainer: finished`` line, so ``finished`` at WARNING.

    The trainer's contract: a completed run prints ``trainer: finished``; this one stopped
    after step 3 of 400. The check's first read of the log reaches its end (the pane shows
    only tmux's "Pane is dead" line), so the missing line is known, not guessed.
    """
    code, log = _silent_facts(fault_runs, sandbox)
    assert code == 0
    assert not any(x.startswith("trainer: finished") for x in log)
    assert [x.split()[0] for x in log if x.startswith("step=")] == ["step=1", "step=2", "step=3"]
    status, doc = _check(orch, "f-silent")
    kinds = {f["kind"]: f for f in _findings(doc)}
    assert status == 1, doc
    assert "finished" in kinds and kinds["finished"]["severity"] == "warning", kinds
    assert "exited 0 at step 3 without the trainer's final line" in kinds["finished"]["summary"]
    assert "crashed" not in kinds
    pm = _postmortem(orch, "f-silent", tmp_path)
    v = pm["verdict"]
    assert v["kind"] == "finished" and v["severity"] == "warning" and pm["exit_status"] == 0, v
    assert "trainer: finished" in v["summary"], v


def _drift_seen(
    fr: FaultRuns, key: str, timeout_s: float, pred: Callable[[Finding], bool] = lambda f: True
) -> Finding:
    obs = fr.drift

    def found() -> Finding | None:
        if obs.error is not None:
            raise AssertionError(f"the drift stream failed: {obs.error!r}")
        return obs.first(key, pred)

    try:
        return wait_for(found, timeout_s, 0.5, f"{key} from the drift run's stream")
    except AssertionError:
        last = obs.history[-1] if obs.history else None
        seen = sorted({f"{f.kind}:{f.playbook}" for _, f in obs.found})
        raise AssertionError(
            f"{key} never fired as expected; seen: {seen}; last metrics: "
            f"{last.metrics if last else None}; snapshots: {len(obs.history)}"
        ) from None


@pytest.mark.e2e
def test_slow_fault_is_a_throughput_drop(fault_runs: FaultRuns) -> None:
    f = _drift_seen(fault_runs, "throughput-drop", 200)
    assert f.severity.name == "WARNING"
    assert "tokens/s fell to" in f.summary, f.summary


@pytest.mark.e2e
def test_nan_fault_is_the_nan_loss_log_signature(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns
) -> None:
    f = _drift_seen(fault_runs, "log-signature:nan-loss", 200)
    assert f.evidence and f.evidence[0].startswith(f"step={NAN_AT} loss=nan "), f.evidence
    code, doc = _check(orch, "f-drift")  # and the one-shot check sees it in the log tail
    nan = [f for f in _findings(doc) if f["playbook"] == "nan-loss"]
    assert code == 2 and nan and nan[0]["severity"] == "critical", _findings(doc)


def _hung(f: Finding) -> bool:
    return f"last step {HANG_AT - 1}" in f.evidence


@pytest.mark.e2e
def test_hang_fault_is_a_stall_in_the_watch_stream(fault_runs: FaultRuns) -> None:
    f = _drift_seen(fault_runs, "stall", 200, _hung)
    assert f.severity.name == "CRITICAL"
    assert "while the process lives" in f.summary, f.summary
    last = fault_runs.drift.history[-1]
    assert last.run is not None and last.run.exit_status is None, "the hung run is still alive"
    assert last.run.heartbeat_age_s is not None
    assert last.run.heartbeat_age_s >= THRESHOLDS["stall_timeout_s"] - 2, "heartbeat frozen"


@pytest.mark.e2e
def test_hang_fault_is_a_stall_in_orch_check(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns
) -> None:
    """``orch check`` continues the log from its last offset, so a hung log reads as quiet."""
    _drift_seen(fault_runs, "stall", 200, _hung)  # the stream has seen the hang by now
    _check(orch, "f-drift")  # two checks in a row, both long after the last log line
    code, doc = _check(orch, "f-drift")
    stalls = [f for f in _findings(doc) if f["kind"] == "stall"]
    assert code == 2 and stalls, _findings(doc)
    assert stalls[0]["severity"] == "critical" and "while the process lives" in stalls[0]["summary"]


@pytest.mark.e2e
def test_orch_check_stall_names_the_last_step(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns
) -> None:
    """``orch check`` continues the log at an offset: a check that reads no new line has no
    metrics (agent/snapshot.py parses new lines only); the step comes from the newest stored
    snapshot that has one."""
    _drift_seen(fault_runs, "stall", 200, _hung)
    code, doc = _check(orch, "f-drift")
    stalls = [f for f in _findings(doc) if f["kind"] == "stall"]
    assert stalls and f"last step {HANG_AT - 1}" in stalls[0]["evidence"], stalls


@pytest.mark.e2e
def test_no_stall_before_the_first_step_within_the_startup_grace(fault_runs: FaultRuns) -> None:
    """Before the first step (no step, no heartbeat) the stall timeout is
    max(stall_timeout_s, startup_grace_s): importing torch here takes longer than 8 s."""
    _drift_seen(fault_runs, "log-signature:nan-loss", 200)  # the drift run is well past startup
    early = [f for stepped, f in fault_runs.drift.found if f.kind == "stall" and not stepped]
    assert not early, early[0]


@pytest.mark.e2e
def test_hung_run_postmortem_verdict_is_the_stall(
    orch: Callable[..., tuple[int, str]], fault_runs: FaultRuns, tmp_path: Path
) -> None:
    """A live run is judged on its worst problem; stall ranks above a log signature.

    The postmortem re-reads the log's tail; verdict.py places it on the recorder sample of when
    it was written, so the postmortem's own read is no progress. That sample can come up to one
    recorder interval (2 s) after the last line, so the postmortem may see the stall up to that
    much later than the watch stream did: it is polled."""
    _drift_seen(fault_runs, "stall", 200, _hung)
    tries = iter(range(1000))

    def judged() -> dict[str, Any] | None:
        pm = _postmortem(orch, "f-drift", tmp_path / f"try{next(tries)}")
        return pm if "stall" in {f["kind"] for f in pm["findings"]} else None

    pm = wait_for(judged, 60, 1.0, "a postmortem that sees the hung run's stall")
    kinds = {f["kind"] for f in pm["findings"]}
    assert pm["exit_status"] is None and "log-signature" in kinds, kinds
    assert "stall" in kinds, kinds
    assert pm["verdict"]["kind"] == "stall", pm["verdict"]


@pytest.mark.e2e
def test_default_dflash_config_is_refused_where_torch_sees_no_cuda(
    orch: Callable[..., tuple[int, str]], contract_config: Path
) -> None:
    """GPUs assigned, no ``trainer_config``: the default ``dflash-8gpu`` needs 8 CUDA devices
    and the sandbox's CPU torch sees none; preflight refuses (exit 4) with the one-line fix."""
    code, out = orch("launch", "gpu-default", "--json")
    assert code == 4, out
    assert "'dflash-8gpu' needs 8 CUDA devices, torch in gpu-default sees 0" in out, out
    assert "trainer_config: tiny-cpu" in out and "-- --config tiny-cpu" in out, out
    workdir = yaml.safe_load(contract_config.read_text())["containers"]["gpu-default"]["workdir"]
    assert not (Path(workdir) / "runs").exists() or not any((Path(workdir) / "runs").iterdir())
