"""``orch demo``: the whole loop on this machine, against a throwaway sandbox.

Steps (each reported with its duration through a :class:`DemoUI`):

1. **requirements**: tmux, sshd, ssh-keygen, a C compiler, torch for the
   container's python; everything missing is named with its install command
   (:func:`missing_requirements`, :class:`DemoMissing`, exit 2).
2. **sandbox**: ``orchestrator.sandbox.manager.up`` in its own state directory
   (1 container ``ct200``, 8 simulated GPUs, scenario ``idle`` so the launch's
   preflight finds free GPUs) and ``demo.yaml`` beside its hosts.yaml
   (``trainer_config: tiny-cpu``).
3. **launch**: the bundled trainer through ssh and ``pct exec`` (``orch launch``).
4. **watch**: a few seconds of ``orch watch`` (plain lines when not a terminal).
5. **fault**: seed 000's ghost (GPU 3 at 100 % with 0 MiB) and/or SIGKILL to the
   trainer's python process, sent through the container's transport; the
   watch continues until the detectors (``run_detectors``) report the
   finding(s) or ``detect_timeout_s`` passes.
6. **postmortem**: ``orchestrator.postmortem.collect.postmortem`` into
   ``<state>/postmortem/``: verdict and report.html.
7. **teardown**: ``manager.down`` (processes only; the files stay so the report
   can be read), unless ``keep``.

No rich here: rendering is the UI's job (``orchestrator/views/demo.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config.inventory import Inventory
from orchestrator.errors import OrchError, UsageError
from orchestrator.wire.model import Finding, Snapshot

CONTAINER = "ct200"
FAULTS = ("kill", "ghost", "both")
TORCH_INSTALL = "python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu"

# Runs in the container: SIGKILL to the run's process group as the wrapper recorded it (`pgid`:
# the command and its tee; the wrapper outside the group records exit status 137). Exit 3 and
# the exit status when the run had already ended: there is nothing left to kill.
_KILL_RUN = r"""
import os, signal, sys
run_dir = sys.argv[1]
def read(name):
    try:
        with open(os.path.join(run_dir, name)) as fh:
            return fh.read().strip()
    except OSError:
        return ''
status = read('exit_status')
if status:
    print('exit status ' + status)
    sys.exit(3)
pgid = int(read('pgid') or 0)
if pgid <= 1:
    print('no process group recorded in ' + run_dir)
    sys.exit(1)
try:
    os.killpg(pgid, signal.SIGKILL)
except ProcessLookupError:
    print('process group %d is gone and no exit status was written' % pgid)
    sys.exit(3)
print(pgid)
"""
KILL_ENDED = 3
"""``_KILL_RUN``'s exit status when the run had already ended."""


@dataclass(frozen=True, slots=True)
class Missing:
    """A requirement that is not there, and the command that installs it."""

    what: str
    install: str


class DemoMissing(OrchError):
    """The demo cannot run: these requirements are missing (exit 2).

    >>> str(DemoMissing([Missing("tmux", "apt-get install -y tmux")]))
    'orch demo needs what is missing here:\\n  tmux: apt-get install -y tmux'
    """

    exit_code = 2

    def __init__(self, missing: Sequence[Missing]) -> None:
        self.missing = tuple(missing)
        lines = [f"  {m.what}: {m.install}" for m in self.missing]
        super().__init__("orch demo needs what is missing here:\n" + "\n".join(lines))


class DemoFailed(OrchError):
    """A demo step did not do what it should (exit 1); the message names the step."""


def missing_requirements(python: str = "python3", timeout_s: float = 20.0) -> list[Missing]:
    """What the sandbox and the bundled trainer need and this machine lacks.

    Checks PATH for tmux, ssh-keygen and a C compiler, the sshd binary the sandbox
    uses, and whether ``python`` (the container's interpreter: the sandbox's
    containers share this machine's) can find torch, without importing it.
    """
    from orchestrator.sandbox import sshd
    from orchestrator.sandbox.fakenvml import MissingTool, find_compiler

    out: list[Missing] = []
    if not shutil.which("tmux"):
        out.append(Missing("tmux", "apt-get install -y tmux"))
    if not os.access(sshd.SSHD, os.X_OK):
        out.append(Missing(f"sshd ({sshd.SSHD})", "apt-get install -y openssh-server"))
    if not shutil.which(sshd.SSH_KEYGEN):
        out.append(Missing("ssh-keygen", "apt-get install -y openssh-client"))
    try:
        find_compiler()
    except MissingTool:
        out.append(Missing("a C compiler (cc)", "apt-get install -y gcc"))
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    try:
        rc = subprocess.run(
            [python, "-c", probe], capture_output=True, timeout=timeout_s, check=False
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        rc = 127
    if rc == 127:
        out.append(Missing(python, "apt-get install -y python3"))
    elif rc != 0:
        out.append(Missing(f"torch (for {python}, the trainer needs it)", TORCH_INSTALL))
    return out


class DemoUI(Protocol):
    """What the demo reports to; ``orchestrator.views.demo.RichDemoUI`` renders it."""

    def step(self, name: str, status: str, detail: str, elapsed_s: float | None) -> None: ...

    def phase(self, name: str, status: str, detail: str) -> None: ...

    def watch(
        self,
        inventory: Inventory,
        name: str,
        *,
        seconds: float,
        on_snapshot: Callable[[Snapshot], bool],
    ) -> None: ...

    def findings(self, findings: Sequence[Finding]) -> None: ...

    def verdict(self, pm: Any) -> None: ...

    def report(self, pm: Any) -> tuple[str, str]:
        """(report.md, report.html) of a postmortem, for its bundle."""
        ...

    def ask(self, question: str, default: bool = False) -> bool:
        """A yes/no question; Enter answers ``default``."""
        ...

    def done(self, result: DemoResult) -> None: ...


@dataclass
class DemoResult:
    """What the demo did: where, which run, what it found, the verdict, and the timings."""

    state_dir: Path
    config_path: Path
    run_id: str | None = None
    findings: list[Finding] = field(default_factory=list)
    verdict: Any = None
    report_html: Path | None = None
    kept: bool = False
    steps: list[tuple[str, float]] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "config": str(self.config_path),
            "run_id": self.run_id,
            "findings": [f.to_dict() for f in self.findings],
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "report_html": str(self.report_html) if self.report_html else None,
            "kept": self.kept,
            "steps": [{"step": n, "seconds": round(s, 2)} for n, s in self.steps],
            "elapsed_s": round(self.elapsed_s, 2),
        }

    def explore_commands(self) -> list[str]:
        """The commands to look around in a kept sandbox."""
        c = f"orch -c {self.config_path}"
        return [
            f"{c} watch",
            f"{c} status",
            f"{c} logs {CONTAINER}",
            f"{c} postmortem {CONTAINER}",
            f"orch sandbox scenario ghost --dir {self.state_dir}",
            f"orch sandbox down --dir {self.state_dir}",
        ]

    def next_commands(self) -> list[str]:
        """The three commands to try after a demo that tore its sandbox down."""
        return [
            "orch demo --keep        (the same loop, then the sandbox stays up to explore)",
            "orch init               (a hosts.yaml for your own Proxmox host)",
            "orch doctor             (checks that host and container, step by step)",
        ]


def expected_kinds(fault: str) -> tuple[frozenset[str], ...]:
    """For each fault stage, the finding kinds that show it was seen (any one suffices).

    >>> [sorted(k) for k in expected_kinds("both")]
    [['ghost-utilization'], ['crashed', 'silent-death']]
    """
    ghost = frozenset({"ghost-utilization"})
    killed = frozenset({"crashed", "silent-death"})
    return {"ghost": (ghost,), "kill": (killed,), "both": (ghost, killed)}[fault]


def write_demo_config(state_dir: Path, trainer_config: str = "tiny-cpu") -> Path:
    """``demo.yaml``: the sandbox's hosts.yaml with ``trainer_config`` (a bundled config) on
    ct200."""
    import yaml

    doc = yaml.safe_load((state_dir / "hosts.yaml").read_text())
    doc["containers"][CONTAINER]["trainer_config"] = trainer_config
    doc.setdefault("defaults", {})["poll_interval"] = 1
    path = state_dir / "demo.yaml"
    head = f"# Written by `orch demo`: the sandbox in {state_dir}, trainer {trainer_config} on {CONTAINER}.\n"
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    return path


def bundled_trainer_configs() -> list[str]:
    """The names of the trainer's bundled configs (``trainer/configs/*.yaml``), sorted.

    >>> {"tiny-cpu", "instant-cpu"} <= set(bundled_trainer_configs())
    True
    """
    from orchestrator.lifecycle.bundle import trainer_root

    return sorted(p.stem for p in (trainer_root() / "configs").glob("*.yaml"))


class _Clock:
    def __init__(self, ui: DemoUI, result: DemoResult) -> None:
        self.ui, self.result = ui, result
        self.t0 = time.monotonic()

    def run(self, name: str, detail: str, fn: Callable[[], str | None]) -> None:
        """Run one step: report start, call ``fn`` (its return is the done detail), report done."""
        start = time.monotonic()
        self.ui.step(name, "start", detail, None)
        try:
            done = fn()
        except BaseException as exc:
            self.ui.step(
                name,
                "fail",
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                time.monotonic() - start,
            )
            raise
        took = time.monotonic() - start
        self.result.steps.append((name, took))
        self.ui.step(name, "ok", done or detail, took)


def run_demo(
    ui: DemoUI,
    *,
    state_dir: Path | str | None = None,
    keep: bool = False,
    fault: str = "both",
    watch_s: float = 5.0,
    detect_timeout_s: float = 30.0,
    interactive: bool = False,
    trainer_config: str = "tiny-cpu",
) -> DemoResult:
    """Run the demo (module doc). ``interactive`` asks before the fault and before teardown.

    ``trainer_config`` names a bundled trainer config (``tiny-cpu``; ``instant-cpu`` steps in
    about a millisecond); the run trains until the demo ends it, whatever the config's speed.

    Raises:
        DemoMissing: a requirement is missing (nothing was started).
        UsageError: unknown ``fault``, or ``state_dir`` holds a running sandbox.
        DemoFailed: a fault was not detected in time, or no verdict was reached.
        OrchError: from the sandbox, the launch or the postmortem, as they come.
        The sandbox is torn down on every failure unless ``keep``.
    """
    if fault not in FAULTS:
        raise UsageError(f"--fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    configs = bundled_trainer_configs()
    if trainer_config not in configs:
        raise UsageError(
            f"--trainer-config must be a bundled config ({', '.join(configs)}), "
            f"got {trainer_config!r}"
        )
    from orchestrator.sandbox import manager

    t0 = time.monotonic()
    state = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="orch-demo-"))
    if (state / "state.json").exists() and manager.status(state).get("running"):
        raise UsageError(
            f"{state}: a sandbox already runs there; use another --dir or "
            f"orch sandbox down --dir {state}"
        )
    result = DemoResult(state_dir=state.resolve(), config_path=state.resolve() / "demo.yaml")
    clock = _Clock(ui, result)

    def requirements() -> str:
        missing = missing_requirements()
        if missing:
            raise DemoMissing(missing)
        return "tmux, sshd, ssh-keygen, cc, torch: all present"

    clock.run("check", "tmux, sshd, a C compiler, torch", requirements)
    up = False
    try:

        def sandbox() -> str:
            nonlocal up
            info = manager.up(state, containers=1, gpus=8, scenario="idle")
            up = True
            write_demo_config(state, trainer_config)
            kind = "LXC container" if info.isolation == "lxc" else "process-mode container"
            return (
                f"1 {kind} ({CONTAINER}), {info.gpus} simulated GPUs, "
                f"sshd on 127.0.0.1:{info.port}, state in {state}"
                + (f"; {info.fallback}" if info.fallback else "")
            )

        clock.run("sandbox", "starting sshd, the pct stand-in and the fake NVML", sandbox)
        _loop(ui, clock, result, fault, watch_s, detect_timeout_s, interactive)
        if interactive and not keep:
            keep = ui.ask("Leave the sandbox running to explore it?")
    finally:
        from orchestrator.transport.connect import close_all

        close_all()
        if up and not keep:
            clock.run(
                "teardown",
                "stopping sshd, tmux and every sandbox process",
                lambda: _down(manager, state),
            )
    result.kept = keep and up
    result.elapsed_s = time.monotonic() - t0
    ui.done(result)
    return result


def _down(manager: Any, state: Path) -> str:
    res = manager.down(state)
    return (
        f"sshd stopped, {len(res['containers'])} container(s) stopped, "
        f"{res['killed']} straggler(s) killed; files stay in {state}"
    )


def _loop(
    ui: DemoUI,
    clock: _Clock,
    result: DemoResult,
    fault: str,
    watch_s: float,
    detect_timeout_s: float,
    interactive: bool,
) -> None:
    """Launch, watch, fault, detect, postmortem: each step waits for a state under a deadline.

    The run trains ``--forever``, so its end is the demo's doing (the kill, or ``orch stop``
    at the end), never the machine's speed. A run that ended on its own before the kill is
    said so, and the demo goes on to the postmortem of what happened.
    """
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lifecycle import launch, stop
    from orchestrator.monitor.judge import judge
    from orchestrator.monitor.state import stepped
    from orchestrator.remote.target import Target
    from orchestrator.sandbox import manager

    inv = load_inventory(result.config_path)
    cfg = inv.container(CONTAINER)
    history: list[Snapshot] = []
    lock = threading.Lock()
    ended: list[str] = []  # how the run ended, when it ended before the demo killed it

    def findings() -> list[Finding]:
        with lock:
            hist = list(history)
        return list(judge(CONTAINER, cfg, hist).findings) if hist else []

    def launched() -> str:
        res = launch.launch(
            inv, CONTAINER, run_name="demo", on_phase=ui.phase, trainer_args=["--forever"]
        )
        result.run_id = res.run_id
        return f"run {res.run_id} verified alive in tmux session {res.session!r}"

    clock.run(
        "launch",
        f"bundled trainer ({cfg.trainer_config}) in {CONTAINER} via ssh + "
        "pct exec, training until the demo ends it",
        launched,
    )

    def keep_all(snap: Snapshot) -> bool:
        with lock:
            history.append(snap)
        return False

    def note_end(snap: Snapshot) -> bool:
        run = snap.run
        if run is None or run.run_id != result.run_id or run.exit_status is None:
            return False
        if not ended:
            ended.append(f"exit status {run.exit_status}")
        return True

    first_step: list[float] = []

    def training(snap: Snapshot) -> bool:
        keep_all(snap)
        if note_end(snap):
            return True
        if not first_step and snap.run is not None and stepped(snap):
            first_step.append(time.monotonic())
        return bool(first_step) and time.monotonic() - first_step[0] >= watch_s

    def watched() -> str:
        deadline_s = watch_s + detect_timeout_s
        ui.watch(inv, CONTAINER, seconds=deadline_s, on_snapshot=training)
        if ended:
            return f"the run ended on its own ({ended[0]})"
        if not first_step:
            raise DemoFailed(
                f"the run showed no training step within {deadline_s:g} s; "
                f"orch -c {result.config_path} logs {CONTAINER} shows why"
            )
        return f"the run is training ({watch_s:g} s shown after its first step)"

    clock.run("watch", f"orch watch {CONTAINER} until the run trains, then {watch_s:g} s", watched)
    if interactive and not ui.ask("Inject the fault now?", default=True):
        _stop_run(stop, inv, result, ui)
        return
    target = Target(inv, CONTAINER)
    stages = expected_kinds(fault)
    for i, want in enumerate(stages):
        ghost = "ghost-utilization" in want

        def inject(ghost: bool = ghost) -> str:
            if ghost:
                manager.set_scenario(result.state_dir, "ghost")
                return "GPU scenario -> ghost: GPU 3 at 100 % with 0 MiB and no process (seed 000)"
            if ended:
                return f"nothing to kill: the run already ended ({ended[0]})"
            run_dir = f"{cfg.workdir.rstrip('/')}/runs/{result.run_id}"
            res = target.transport.run([cfg.python, "-c", _KILL_RUN, run_dir], timeout=30)
            said = (res.out or res.err).strip()[-200:]
            if res.exit_status == KILL_ENDED:
                ended.append(said or "gone")
                return f"nothing to kill: the run already ended ({ended[0]})"
            if not res.ok:
                raise DemoFailed(f"could not kill the run in {run_dir}: {said or res.exit_status}")
            return f"SIGKILL to the run's process group {said} through ssh + pct exec"

        clock.run("fault", "ghost GPU" if ghost else "kill -9 the run's process group", inject)
        if not ghost and ended:
            ui.findings(result.findings)
            break
        seen: list[Finding] = []

        def until_found(
            snap: Snapshot, want: frozenset[str] = want, seen: list[Finding] = seen
        ) -> bool:
            keep_all(snap)
            found = [f for f in findings() if f.kind in want]
            if found and not seen:
                seen.extend(found)
            return bool(found)

        def detect(want: frozenset[str] = want, seen: list[Finding] = seen) -> str:
            # until_found is called within this iteration, while its loop variables hold
            ui.watch(inv, CONTAINER, seconds=detect_timeout_s, on_snapshot=until_found)
            if not seen:
                raise DemoFailed(
                    f"no {' or '.join(sorted(want))} finding within "
                    f"{detect_timeout_s:g} s of the fault"
                )
            return ", ".join(f"{f.severity.name}:{f.kind}" for f in seen)

        clock.run("detect", f"watching until {' or '.join(sorted(want))} appears", detect)
        result.findings = findings()
        ui.findings(seen if i + 1 < len(stages) else result.findings)
    if fault == "ghost":
        _stop_run(stop, inv, result, ui)

    def judged() -> str:
        from orchestrator.postmortem import collect as postmortem

        pm = postmortem.postmortem(
            inv,
            CONTAINER,
            run_id=result.run_id,
            out=result.state_dir / "postmortem",
            report=ui.report,
        )
        result.verdict = pm.verdict
        html = Path(pm.bundle or result.state_dir / "postmortem") / "report.html"
        result.report_html = html if html.exists() else None
        ui.verdict(pm)
        if not pm.verdict.reached and not ended:
            raise DemoFailed(f"the postmortem found the run healthy ({pm.verdict.summary})")
        return f"verdict {pm.verdict.kind}; report {result.report_html}"

    clock.run("postmortem", f"orch postmortem {CONTAINER}", judged)


def _stop_run(stop: Any, inv: Inventory, result: DemoResult, ui: DemoUI) -> None:
    """``orch stop`` the demo's run, which trains until stopped (no kill fault, or declined)."""
    ui.step("stop", "start", f"orch stop {CONTAINER}: the run trains until stopped", None)
    t0 = time.monotonic()
    doc = stop.stop(inv, CONTAINER, run_id=result.run_id, grace_s=20.0, by="orch demo")
    took = time.monotonic() - t0
    result.steps.append(("stop", took))
    how = "stopped on request" if doc.stopped else f"had already ended ({doc.state})"
    ui.step("stop", "ok", f"run {result.run_id} {how}", took)
