"""watch's pure layers: the model, the rendering at 80x24, plain lines, and the pump's backoff."""

from __future__ import annotations

import dataclasses
import io
import queue
import threading
import time

from rich.console import Console

from orchestrator.config.inventory import ContainerConfig
from orchestrator.monitor import observe
from orchestrator.monitor.judge import Judgement, with_unreachable
from orchestrator.monitor.state import target_state
from orchestrator.views import watch as w
from orchestrator.views import watch_model
from orchestrator.wire.model import Finding, Severity, Snapshot
from tests.helpers import wait_for
from tests.views.snapshots import gpus, running

GHOST = Finding(
    "ghost-utilization",
    Severity.CRITICAL,
    "ct201",
    "GPU 3 at 100 % with 0 MiB",
    gpus=(3,),
    playbook="ghost-utilization",
    evidence=("util 100 % mem 0 MiB x3",),
)
TITLES = {"ghost-utilization": "GPU busy with no memory"}


def fake_judge(name, cfg, history):
    """Stands in for the monitor's judgement (its own tests cover it): ghost when GPU 3 is
    100 %/0 MiB, the state as the monitor names it."""
    last = history[-1]
    found = _ghost(history)
    findings = tuple(with_unreachable(name, last, found))
    return Judgement(name, last, target_state(last, findings), findings)


def _ghost(history):
    last = history[-1]
    if (
        last.reachable
        and last.gpus
        and last.gpus[3].utilization_pct == 100.0
        and not last.gpus[3].memory_used_mib
    ):
        return [dataclasses.replace(GHOST, target=last.target)]
    return []


def model(n: int = 3) -> watch_model.WatchModel:
    cfg = ContainerConfig(
        name="x", host="sandbox", gpus={"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
    )
    views = [
        watch_model.TargetView(f"ct{200 + i}", roles=cfg.roles_by_gpu, config=cfg) for i in range(n)
    ]
    return watch_model.WatchModel(views, fake_judge)


def render(renderable, width=80, height=24) -> list[str]:
    console = Console(
        file=io.StringIO(),
        width=width,
        height=height,
        color_system=None,
        legacy_windows=False,
        force_terminal=False,
    )
    console.print(renderable)
    return console.file.getvalue().splitlines()


def test_dashboard_fits_80x24_and_shows_states_and_findings():
    m = model(3)
    m.apply("ct200", running("ct200"))
    m.apply("ct201", running("ct201", gpus=gpus({3: 100.0})))
    m.apply("ct202", running("ct202"))
    m.apply("ct202", Snapshot.unreachable("ct202", 1002.0, "connection refused"))
    lines = render(w.render_dashboard(m, now=1003.0, width=80, height=24, titles=TITLES))
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert "ct200" in text and " running " in text
    assert "CRITICAL ghost-utilization GPU 3 - GPU busy with no memory" in text
    assert f"unreachable since {w.clock(1002.0)}" in text
    assert "dead" not in text
    assert "21.5k tok/s" in text


def test_many_targets_are_cut_with_a_count_not_overflowed():
    m = model(20)
    for name in m.views:
        m.apply(name, running(name))
    lines = render(w.render_dashboard(m, now=1000.0, width=80, height=24))
    assert len(lines) <= 24
    assert "more targets" in lines[-1]


def test_detail_view_has_gpus_evidence_and_tail():
    m = model(2)
    m.apply("ct201", running("ct201", gpus=gpus({3: 100.0})))
    lines = render(
        w.render_detail(m.views["ct201"], now=1000.0, width=80, height=24, titles=TITLES)
    )
    text = "\n".join(lines)
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    assert "GPU 3  target" in text and "GPU 5  drafter" in text
    assert "> util 100 % mem 0 MiB x3" in text
    assert "step 120 loss 2.1" in text


def test_unreachable_since_is_the_first_marker_and_resets_on_reconnect():
    m = model(1)
    m.apply("ct200", running("ct200", at=10.0))
    assert m.apply("ct200", Snapshot.unreachable("ct200", 20.0, "refused"))
    assert not m.apply("ct200", Snapshot.unreachable("ct200", 30.0, "refused"))  # no change
    v = m.views["ct200"]
    assert v.state == "unreachable" and v.unreachable_since == 20.0
    assert m.apply("ct200", running("ct200", at=40.0))
    assert v.state == "running" and v.unreachable_since is None


def test_plain_line_per_change_not_per_step():
    m = model(1)
    assert m.apply("ct200", running("ct200", step=1))
    assert not m.apply("ct200", running("ct200", step=2))
    assert m.apply("ct200", running("ct200", step=3, exit_status=137, pane_dead=True))
    line = w.plain_line(m.views["ct200"], now=0.0)
    assert " ct200 crashed run=r-20250101-1200 step=3" in line


def test_detector_failure_is_shown_not_raised():
    def broken(name, cfg, history):
        raise RuntimeError("bug in a detector")

    m = watch_model.WatchModel([watch_model.TargetView("ct200")], broken)
    m.apply("ct200", running("ct200"))
    assert m.views["ct200"].state == "running"
    assert "ct200: detectors failed: bug in a detector" in m.messages


def test_pump_reconnects_with_backoff_and_reports_unreachable():
    """A connect function stands in for Target.stream_once: the failure sequence is the input."""
    calls = []

    def open_stream():
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise ConnectionError("connection refused")
        return iter([running("ct200", at=float(len(calls)))])

    out: queue.Queue = queue.Queue()
    stop = threading.Event()
    th = threading.Thread(target=observe.pump, args=("ct200", open_stream, out, stop), daemon=True)
    th.start()
    got = []
    wait_for(
        lambda: (got.extend(_drain(out)), any(s.reachable for _, s in got))[1],
        10,
        what="a snapshot",
    )
    stop.set()
    th.join(5)
    assert not th.is_alive()
    markers = [s for _, s in got if not s.reachable]
    assert len(markers) >= 2 and markers[0].errors == ("connection refused",)
    assert calls[2] - calls[1] > calls[1] - calls[0]  # the backoff grows


def _drain(q):
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


def test_tau_is_shown_in_the_row_and_the_plain_line():
    """The bundled trainer's acceptance length (``tau=``) once a log line carried one."""
    m = model(1)
    snap = running("ct200")
    m.apply("ct200", snap)
    assert "τ" not in "\n".join(render(w.render_dashboard(m, now=1001.0, width=80, height=24)))
    metrics = dataclasses.replace(snap.metrics, tau=2.31)
    m.apply("ct200", dataclasses.replace(snap, taken_at=snap.taken_at + 1, metrics=metrics))
    text = "\n".join(render(w.render_dashboard(m, now=1002.0, width=80, height=24)))
    assert "τ 2.31" in text
    assert "tau=2.31" in w.plain_line(m.views["ct200"], now=1002.0)
