"""The reliability suite's plugin (fault table) and its fault-injection fixtures.

Plugin: every test marked ``@pytest.mark.fault(area=, fault=, must=)`` is one row of
the published table. A test calls ``observe("unreachable after 7.9 s")`` with what
it actually saw; the outcome (pass, FAIL, xfail with the missing piece) comes from
the run. ``pytest tests/reliability --reliability-table`` rewrites
``docs/reliability.md`` from that run (``python -m tests.reliability.table`` does the same).

Fixtures: ``fleet`` is one sandbox per test module (faults would leak into other
areas' tests through the shared session sandbox), with a hosts.yaml tuned for fast
failure detection (keepalive 1 s, connect timeout 3 s, poll interval 1 s).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import SANDBOX_ISOLATION
from tests.reliability import table

ROOT = Path(__file__).resolve().parents[2]
CANARY = "s3cr3t-canary"

# --- plugin: the fault table -----------------------------------------------------------------

_ROWS: dict[str, dict[str, Any]] = {}
_STARTED = time.monotonic()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-table",
        action="store",
        nargs="?",
        const=str(table.DEFAULT_DOC),
        default=None,
        metavar="PATH",
        help="write the fault table of this run (default docs/reliability.md)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        mark = item.get_closest_marker("fault")
        if mark is None:
            continue
        kw = mark.kwargs
        missing = [k for k in ("area", "fault", "must") if not kw.get(k)]
        if missing:
            raise pytest.UsageError(f"{item.nodeid}: fault marker lacks {', '.join(missing)}")
        _ROWS[item.nodeid] = _row(item.nodeid, kw)
        # under pytest-xdist the controller collects nothing: the row travels with the report
        item.user_properties.append(("fault_row", {k: kw[k] for k in ("area", "fault", "must")}))


def _row(nodeid: str, kw: dict[str, Any]) -> dict[str, Any]:
    return {
        "test": nodeid.split("tests/reliability/", 1)[-1],
        "area": kw["area"],
        "fault": kw["fault"],
        "must": kw["must"],
        "observed": [],
        "result": "not run",
        "reason": "",
        "duration_s": 0.0,
    }


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _ROWS.get(report.nodeid)
    if row is None:
        kw = next((v for k, v in report.user_properties if k == "fault_row"), None)
        if kw is None:
            return
        row = _ROWS[report.nodeid] = _row(report.nodeid, kw)
    row["observed"] = [v for k, v in report.user_properties if k == "observed"]
    row["duration_s"] += report.duration
    xfail = getattr(report, "wasxfail", None)
    if report.when == "call" or report.outcome != "passed":
        if xfail is not None and report.skipped:
            row["result"], row["reason"] = "xfail", str(xfail)
        elif report.skipped:
            row["result"] = "skipped"
            longrepr = report.longrepr
            row["reason"] = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
        elif report.failed:
            if row["result"] != "FAIL":
                row["result"] = "FAIL" if report.when == "call" else f"FAIL ({report.when})"
                crash = getattr(report.longrepr, "reprcrash", None)
                row["reason"] = crash.message if crash is not None else str(report.longrepr)[-300:]
        elif report.when == "call":
            row["result"] = "pass"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--reliability-table", default=None)
    if not path or not _ROWS or session.config.getoption("collectonly"):
        return
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        return
    rows = [r for r in _ROWS.values() if r["result"] != "not run"]
    text = table.render(rows, wall_s=time.monotonic() - _STARTED)
    Path(path).write_text(text, encoding="utf-8")


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``observe(text)``: record what the test saw; it becomes the table's "observed" cell."""

    def note(text: str) -> None:
        request.node.user_properties.append(("observed", str(text)))
        print(f"observed: {text}")

    return note


# --- the fleet: one sandbox per module ---------------------------------------------------------

TRAINER = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500"; sleep 0.5; done'
"""A fake trainer: a step line every 0.5 s (the log detectors and metrics parse it)."""


@dataclass
class Fleet:
    """A running sandbox plus the faults the reliability tests inject into it."""

    info: Any
    state_dir: Path
    config: Path
    interval_s: float = 1.0
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    def inventory(self) -> Any:
        from orchestrator.config.inventory import load_inventory

        return load_inventory(self.config)

    def orch(
        self, *args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``orch -c <config> ARGS`` as a real process (its own SSH pool, its own threads)."""
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-c", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )

    def scenario(self, name: str | dict[str, Any]) -> None:
        from orchestrator.sandbox import manager

        manager.set_scenario(self.state_dir, name)

    def agent_launch(self, container: str = "ct200", cmd: str = TRAINER) -> str:
        """Start ``cmd`` as a run through the agent (no preflight, no recorder); its run id."""
        from orchestrator.remote.target import Target

        inv = self.inventory()
        c = inv.container(container)
        doc = Target(inv, container).agent(
            [
                "launch",
                "--workdir",
                c.workdir,
                "--session",
                c.session,
                "--cmd",
                cmd,
                "--no-recorder",
                "--force",
                "--grace",
                "2",
            ],
            timeout=60,
        )
        assert doc.get("ok"), doc
        return str(doc["run_id"])

    def run_dir(self, container: str = "ct200") -> Path:
        runs = self.info.workdir(container) / "runs"
        return runs / (runs / "current").read_text().strip()

    def kill_trainer(self, container: str = "ct200", sig: int = signal.SIGKILL) -> None:
        """Signal the trainer's process group; the wrapper records 128+N as the exit status."""
        pgid = int((self.run_dir(container) / "pgid").read_text().split()[0])
        self.info.kill(container, pgid, sig, group=True)  # a PID from inside the container

    def vanish(self, container: str = "ct200") -> None:
        """SIGKILL the wrapper, the trainer's group and the tmux server at once (seed 000's shape)."""
        run = self.run_dir(container)
        self.info.kill(container, int((run / "wrapper.pid").read_text().split()[0]))
        self.info.kill(container, int((run / "pgid").read_text().split()[0]), group=True)
        self.kill_tmux(container)

    def kill_tmux(self, container: str = "ct200") -> int:
        from orchestrator.sandbox import manager

        pid = manager.kill_tmux_server(self.state_dir, container)
        assert pid, "no tmux server to kill"
        return pid

    def stop_sshd(self) -> None:
        from orchestrator.sandbox import manager

        assert manager.stop_sshd(self.state_dir), "sshd was not running"

    def start_sshd(self) -> None:
        from orchestrator.sandbox import manager

        manager.start_sshd(self.state_dir)

    def stop_container(self, container: str = "ct200") -> None:
        from orchestrator.sandbox import manager

        manager.stop_container(self.state_dir, container)

    def start_container(self, container: str = "ct200") -> None:
        from orchestrator.sandbox import manager

        with contextlib.suppress(manager.SandboxError):
            manager.start_container(self.state_dir, container)

    def kernel_line(self, text: str, level: int = 3) -> None:
        from orchestrator.sandbox import kernel

        kernel.append_kernel_line(self.state_dir, text, level=level)

    def watch(self, *targets: str, interval_s: float | None = None) -> WatchProc:
        """``orch watch --plain`` as a real process; stopped at the end of the test module."""
        w = WatchProc(self, list(targets), interval_s or self.interval_s)
        self._cleanups.append(w.stop)
        return w


def tuned_config(info: Any, dest: Path, *, interval_s: float, **host: Any) -> Path:
    """The sandbox hosts.yaml with fast failure detection (and ``host`` overrides)."""
    doc = yaml.safe_load(Path(info.config_path).read_text())
    for h in doc["hosts"].values():
        h.update({"keepalive_s": 1, "connect_timeout_s": 3, **host})
    doc["defaults"]["poll_interval"] = interval_s
    # a run proves itself (or is flagged log-missing) within seconds, not the default minute
    doc["defaults"]["thresholds"] = {"startup_timeout_s": 3, "startup_grace_s": 3}
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


@contextlib.contextmanager
def proxied(fleet: Fleet, dest: Path, *, delay_ms: float, **host: Any) -> Iterator[Path]:
    """A hosts.yaml (at ``dest``) reaching the sandbox sshd through bench/delay_proxy.py
    (``delay_ms`` each way; known_hosts to match); the proxy dies when the block ends, or
    earlier when the block kills it (``proxied.proxy``): a cut connection."""
    from tests.views.test_delay_proxy import free_port

    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "delay_proxy.py"),
            "--delay-ms",
            str(delay_ms),
            f"127.0.0.1:{port}=127.0.0.1:{fleet.info.port}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    PROXIES[dest] = proxy
    try:
        assert proxy.stdout is not None and proxy.stdout.readline().strip() == "ready"
        key = Path(fleet.info.known_hosts_path).read_text().split(None, 1)[1]
        known = dest.with_suffix(".known_hosts")
        known.write_text(f"[127.0.0.1]:{port} {key}")
        doc = yaml.safe_load(fleet.config.read_text())
        doc["hosts"]["sandbox"].update(port=port, known_hosts=str(known), **host)
        dest.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield dest
    finally:
        PROXIES.pop(dest, None)
        proxy.terminate()
        proxy.wait(timeout=10)


PROXIES: dict[Path, subprocess.Popen[str]] = {}
"""The running proxy of each :func:`proxied` config (to cut it mid-block: ``.terminate()``)."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A private sandbox for one test module: ct200 (and ct201), 8 GPUs, healthy."""
    from orchestrator.sandbox import manager
    from orchestrator.sandbox.fakenvml import MissingTool
    from orchestrator.transport.connect import close_all

    state_dir = tmp_path_factory.mktemp("rel")
    try:
        info = manager.up(
            state_dir, containers=2, gpus=8, scenario="healthy", isolation=SANDBOX_ISOLATION
        )
    except MissingTool as exc:
        pytest.skip(str(exc))
    fleet = Fleet(info, state_dir, tuned_config(info, state_dir / "tuned.yaml", interval_s=1.0))
    try:
        yield fleet
    finally:
        for undo in reversed(fleet._cleanups):
            with contextlib.suppress(Exception):
                undo()
        close_all()
        manager.down(state_dir)


# --- orch watch --plain as a process ----------------------------------------------------------


class WatchProc:
    """A running ``orch watch --plain``; every stdout line is kept with its arrival time."""

    def __init__(self, fleet: Fleet, targets: list[str], interval_s: float) -> None:
        self.interval_s = interval_s
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "-c",
                str(fleet.config),
                "watch",
                "--plain",
                "--interval",
                str(interval_s),
                *targets,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._q: queue.Queue[tuple[float, str]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            item = (time.monotonic(), line.rstrip("\n"))
            self.lines.append(item)
            self._q.put(item)

    def wait_line(
        self, pred: Callable[[str], bool], timeout_s: float, after: float = 0.0
    ) -> tuple[float, str]:
        """The first line (arrived at or after monotonic ``after``) matching ``pred``."""
        deadline = time.monotonic() + timeout_s
        for t, line in list(self.lines):
            if t >= after and pred(line):
                return t, line
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None and self._q.empty():
                tail = "\n".join(line for _, line in self.lines[-8:])
                err = ""
                if self.proc.poll() is not None and self.proc.stderr is not None:
                    err = self.proc.stderr.read()[-2000:]
                raise AssertionError(
                    f"no matching watch line within {timeout_s} s; last lines:\n{tail}\n{err}"
                )
            try:
                t, line = self._q.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if t >= after and pred(line):
                return t, line

    def last_state(self, target: str) -> str:
        mine = [line for _, line in self.lines if line.split(" ")[1:2] == [target]]
        return mine[-1] if mine else ""

    def stop(self) -> int:
        """SIGINT (watch exits 0 on Ctrl-C), then SIGKILL after 10 s; the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        return int(self.proc.returncode)
