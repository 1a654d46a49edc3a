"""check's pure parts and its thread pool (no sandbox needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.monitor import observe, sweep
from orchestrator.monitor.judge import Judgement, with_unreachable
from orchestrator.views import check
from orchestrator.wire.model import Finding, Severity, Snapshot
from tests.views.snapshots import running

ROOT = Path(__file__).resolve().parents[2]


def test_gather_runs_concurrently_and_sequentially():
    active, peak = [0], [0]
    lock = threading.Lock()

    def job():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.1)
        with lock:
            active[0] -= 1
        return "ok"

    started = time.monotonic()
    got = observe.gather({str(i): job for i in range(8)}, workers=8)
    assert time.monotonic() - started < 0.5 and peak[0] == 8
    assert got == {str(i): "ok" for i in range(8)}
    peak[0] = 0
    started = time.monotonic()
    observe.gather({str(i): job for i in range(4)}, workers=1)
    assert time.monotonic() - started >= 0.4 and peak[0] == 1


def test_gather_returns_exceptions_and_timeouts():
    release = threading.Event()

    def boom():
        raise ConnectionRefusedError("refused")

    started = time.monotonic()
    got = observe.gather({"a": boom, "b": release.wait, "c": lambda: 1}, timeout_s=0.3)
    release.set()
    assert time.monotonic() - started < 2
    assert isinstance(got["a"], ConnectionRefusedError)
    assert isinstance(got["b"], TimeoutError) and "0.3 s" in str(got["b"])
    assert got["c"] == 1


def test_an_abandoned_job_does_not_hold_the_process_exit():
    """A job past its deadline is abandoned: the process exits without waiting for it (a
    ThreadPoolExecutor's exit hook joined it, so Ctrl-C in ``orch watch`` or the end of
    ``orch check`` waited for a stuck SSH call's own deadline)."""
    code = (
        "import threading, time\n"
        "from orchestrator.monitor import observe\n"
        "got = observe.gather({'stuck': threading.Event().wait, 'b': lambda: 1, 'c': lambda: 2},"
        " workers=1, timeout_s=0.2)\n"
        "assert isinstance(got['stuck'], TimeoutError), got\n"
        "assert list(got) == ['stuck', 'b', 'c'] and isinstance(got['b'], TimeoutError), got\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def result(name, snap, *findings):
    return Judgement(name, snap, "running", tuple(findings))


def test_status_table():
    up, down = running("a"), Snapshot.unreachable("b", 1.0, "refused")
    warn = Finding("stall", Severity.WARNING, "a", "s")
    crit = Finding("crashed", Severity.CRITICAL, "a", "c")
    info = Finding("finished", Severity.INFO, "a", "f")
    assert sweep.nagios_status([result("a", up)]) == sweep.OK
    assert sweep.nagios_status([result("a", up, info)]) == sweep.OK
    assert sweep.nagios_status([result("a", up, warn)]) == sweep.WARNING
    assert sweep.nagios_status([result("a", up, warn, crit)]) == sweep.CRITICAL
    assert (
        sweep.nagios_status([result("b", down), result("c", Snapshot.unreachable("c", 1, "x"))])
        == sweep.UNKNOWN
    )
    unreach = with_unreachable("b", down, [])
    assert sweep.nagios_status([result("a", up), result("b", down, *unreach)]) == sweep.WARNING
    assert sweep.nagios_status([]) == sweep.UNKNOWN


def test_json_document_shape():
    f = Finding(
        "ghost-utilization",
        Severity.CRITICAL,
        "a",
        "ghost",
        gpus=(3,),
        playbook="ghost-utilization",
        evidence=("GPU 3: 0 MiB, 100 %",),
    )
    doc = check.to_json(sweep.CheckReport(sweep.CRITICAL, (result("a", running("a"), f),)))
    doc = json.loads(json.dumps(doc))
    assert doc["status"] == "CRITICAL"
    [t] = doc["targets"]
    assert t["name"] == "a" and t["state"] == "running"
    assert t["findings"] == [
        {
            "kind": "ghost-utilization",
            "severity": "critical",
            "gpus": [3],
            "playbook": "ghost-utilization",
            "summary": "ghost",
            "since": None,
            "evidence": ["GPU 3: 0 MiB, 100 %"],
        }
    ]


def test_lines_one_per_problem():
    warn = Finding("stall", Severity.WARNING, "a", "no step for 700 s")
    info = Finding("finished", Severity.INFO, "a", "done")
    down = Snapshot.unreachable("b", 1.0, "refused")
    report = sweep.CheckReport(
        sweep.WARNING,
        (
            result("a", running("a"), warn, info),
            result("b", down, *with_unreachable("b", down, [])),
        ),
        problems=("webhook alert not delivered: HTTP 500",),
    )
    out = check.lines(report)
    assert out[0] == "ORCH WARNING - 2 targets: 0 critical, 2 warning, 1 unreachable"
    assert out[1] == "WARNING a stall: no step for 700 s"
    assert out[2].startswith("WARNING b unreachable: unreachable since ")
    assert out[3] == "UNKNOWN check: webhook alert not delivered: HTTP 500"
    assert len(out) == 4
