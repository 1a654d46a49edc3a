"""The verdict's precedence on hand-built evidence (pure: no sandbox, no I/O)."""

from __future__ import annotations

import pytest

from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import HEALTHY, STOPPED, judge
from orchestrator.wire.model import (
    GpuSample,
    HostProbe,
    KernelEvent,
    ProcessInfo,
    RunManifest,
    Severity,
)

T0 = 1_700_000_000.0
FX = (
    "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function. This is not supported at the moment."
)


def _proc(pid: int, name: str = "python3") -> dict:
    return ProcessInfo(pid=pid, ppid=1, name=name, state="S").to_dict()


def _gpu(index: int, util: float, mem: float) -> dict:
    return GpuSample(
        index=index, utilization_pct=util, memory_used_mib=mem, power_w=110.0, processes=()
    ).to_dict()


def _evidence(**kw) -> Evidence:  # type: ignore[no-untyped-def]
    manifest = RunManifest(
        run_id="r1",
        command="python3 train.py",
        workdir="/w",
        session="train",
        started_at=T0,
        gpus=(0, 1),
    )
    base = dict(
        target="ct200",
        collected_at=T0 + 100,
        run_id="r1",
        run_dir="/w/runs/r1",
        manifest=manifest,
        container_status="running",
        log_exists=True,
        log_tail=("step=1 loss=2.0 tok/s=21500",),
        gpu_history=(
            {"t": T0 + 10, "gpus": [_gpu(0, 50, 9000)], "procs": [_proc(4242)]},
            {"t": T0 + 20, "gpus": [_gpu(0, 50, 9000)], "procs": [_proc(4242)]},
        ),
        agent={
            "session": "train",
            "tmux_server_running": True,
            "state": {"state": "exited", "tmux": {"exists": True, "pane_dead": True}},
        },
    )
    base.update(kw)
    return Evidence(**base)  # type: ignore[arg-type]


def _oom(pid: int, at: float) -> HostProbe:
    line = f"Out of memory: Killed process {pid} (python3) total-vm:1kB"
    ev = KernelEvent(kind="oom-killer", line=line, at=at, pid=pid, process="python3")
    return HostProbe(host="pve1", taken_at=T0 + 99, kernel_events=(ev,))


def test_oom_line_for_the_pid_beats_a_log_signature() -> None:
    ev = _evidence(
        exit_status=137,
        exit_status_at=T0 + 30,
        run_state="exited",
        log_tail=(FX,),
        probe=_oom(4242, T0 + 29),
    )
    v = judge(ev).verdict
    assert (v.kind, v.playbook) == ("oom-killer", "oom-killer")
    assert v.died_at == T0 + 29


def test_oom_line_for_another_process_does_not_count() -> None:
    ev = _evidence(
        exit_status=137,
        exit_status_at=T0 + 30,
        run_state="exited",
        probe=HostProbe(
            host="pve1",
            taken_at=T0,
            kernel_events=(
                KernelEvent(
                    kind="oom-killer",
                    line="Out of memory: Killed process 9 (postgres)",
                    at=T0 + 29,
                    pid=9,
                    process="postgres",
                ),
            ),
        ),
    )
    v = judge(ev).verdict
    assert v.kind == "crashed" and v.playbook is None
    assert "no OOM-killer line" in v.summary


def test_log_signature_beats_the_exit_code() -> None:
    ev = _evidence(exit_status=1, exit_status_at=T0 + 30, run_state="exited", log_tail=("x", FX))
    v = judge(ev).verdict
    assert (v.kind, v.playbook) == ("log-signature", "fx-tracing-race")
    assert v.severity == Severity.CRITICAL and "log line 2" in v.evidence[0]


def test_container_stopped_beats_everything() -> None:
    ev = _evidence(
        container_status="stopped", exit_status=None, log_tail=(FX,), probe=_oom(4242, T0 + 29)
    )
    assert judge(ev).verdict.kind == "container-stopped"


def test_vanished_run_is_silent_death() -> None:
    ev = _evidence(
        run_state="vanished",
        log_exists=False,
        log_tail=(),
        agent={"session": "train", "tmux_server_running": False, "state": {}},
    )
    v = judge(ev).verdict
    assert (v.kind, v.playbook) == ("silent-death", "silent-death")
    assert v.died_at == T0 + 100, "no recorder sample after the last live one: the final state"


def test_finished_run_with_a_ghost_gpu_is_ghost() -> None:
    ghost = tuple({"t": T0 + t, "gpus": [_gpu(3, 100, 0)], "procs": []} for t in (40, 50, 60))
    ev = _evidence(exit_status=0, exit_status_at=T0 + 30, gpu_history=ghost)
    assert judge(ev).verdict.kind == "finished", "the final state has no GPU reading"
    from dataclasses import replace

    from orchestrator.wire.model import Snapshot

    final = Snapshot(
        target="ct200", taken_at=T0 + 100, gpus=(GpuSample.from_dict(_gpu(3, 100, 0)),)
    )
    v = judge(replace(ev, final=final)).verdict
    assert v.kind == "ghost-utilization"


@pytest.mark.parametrize("code", [0, None])
def test_alive_or_finished_without_problems(code: int | None) -> None:
    alive = ProcessInfo(pid=4242, ppid=1, name="python3", state="S")
    from orchestrator.wire.model import Snapshot

    final = Snapshot(target="ct200", taken_at=T0 + 100, processes=(alive,))
    ev = _evidence(
        exit_status=code,
        run_state="running" if code is None else "exited",
        final=final,
        agent={"session": "train", "state": {"tmux": {"exists": True}}},
    )
    v = judge(ev).verdict
    assert v.kind == ("finished" if code == 0 else HEALTHY)
    assert v.reached is (code == 0)


# --- a stop an operator asked for -----------------------------------------------------------

STOP = {
    "stop_requested_at": T0 + 28,
    "stop_requested_by": "orch stop by alice@laptop",
    "stop_signal": "SIGINT",
}


@pytest.mark.parametrize("code", [130, 137, 0])
def test_requested_stop_is_stopped_not_crashed(code: int) -> None:
    ev = _evidence(
        exit_status=code,
        exit_status_at=T0 + 30,
        run_state="exited",
        log_tail=("KeyboardInterrupt",),
        **STOP,
    )
    pm = judge(ev)
    v = pm.verdict
    assert v.kind == STOPPED and v.severity == Severity.INFO and v.reached, v
    assert "stopped by orch stop by alice@laptop" in v.summary and "(SIGINT)" in v.summary
    assert f"exit {code}" in v.summary
    assert "checkpoint" in v.summary and v.died_at == T0 + 30
    assert [f.kind for f in pm.findings if f.severity >= Severity.WARNING] == []
    assert any(f.kind == "finished" and "stopped by" in f.summary for f in pm.findings)


def test_a_crash_before_the_stop_request_is_still_a_crash() -> None:
    ev = _evidence(exit_status=1, exit_status_at=T0 + 20, run_state="exited", **STOP)
    pm = judge(ev)
    assert pm.verdict.kind == "crashed", pm.verdict
    assert any(f.kind == "crashed" and f.severity == Severity.CRITICAL for f in pm.findings)


def test_an_oom_kill_during_the_grace_is_still_the_oom_killer() -> None:
    ev = _evidence(
        exit_status=137,
        exit_status_at=T0 + 30,
        run_state="exited",
        probe=_oom(4242, T0 + 29),
        **STOP,
    )
    assert judge(ev).verdict.kind == "oom-killer"


def test_postmortem_reexports_the_pure_names() -> None:
    from orchestrator.postmortem import collect as postmortem
    from orchestrator.postmortem import verdict

    for name in ("HEALTHY", "STOPPED", "Evidence", "Postmortem", "Verdict", "judge", "decide"):
        assert getattr(postmortem, name) is getattr(verdict, name)


# --- confidence and the next check ---------------------------------------------------------


def test_a_log_signature_verdict_carries_the_match_confidence_and_confirm() -> None:
    ev = _evidence(
        exit_status=1,
        exit_status_at=T0 + 30,
        run_state="exited",
        log_tail=("[E ProcessGroupNCCL.cpp:341] Some NCCL operations have failed or timed out.",),
    )
    v = judge(ev).verdict
    assert (v.kind, v.playbook, v.confidence) == ("log-signature", "nccl-timeout", "probable")
    assert "Watchdog caught collective operation timeout" in v.confirm
    assert v.to_dict()["confidence"] == "probable" and v.to_dict()["confirm"] == v.confirm
    certain = judge(
        _evidence(exit_status=1, exit_status_at=T0 + 30, run_state="exited", log_tail=(FX,))
    ).verdict
    assert certain.confidence == "certain"


def test_a_bare_killed_without_a_kernel_log_is_probable_and_names_the_kernel_log() -> None:
    ev = _evidence(
        exit_status=137,
        exit_status_at=T0 + 30,
        run_state="exited",
        log_tail=("step=40 loss=2.1", "Killed"),
    )
    v = judge(ev).verdict
    assert (v.kind, v.playbook, v.confidence) == ("crashed", None, "probable")
    assert "could not be read" in v.summary and "kernel OOM killer" in v.summary
    assert "host kernel log" in v.confirm and "Out of memory: Killed process" in v.confirm


def test_a_sigkill_the_read_kernel_log_does_not_explain_asks_who_sent_it() -> None:
    ev = _evidence(
        exit_status=137,
        exit_status_at=T0 + 30,
        run_state="exited",
        log_tail=("Killed",),
        kernel_log_source="journalctl",
        kernel_log=("[1.0] usb 1-1: new device",),
    )
    v = judge(ev).verdict
    assert (v.kind, v.confidence) == ("crashed", "probable")
    assert "no OOM-killer line" in v.summary and "who sent SIGKILL" in v.confirm


def test_the_reports_show_confidence_and_confirm() -> None:
    from orchestrator.views.postmortem import html, markdown

    pm = judge(
        _evidence(exit_status=137, exit_status_at=T0 + 30, run_state="exited", log_tail=("Killed",))
    )
    md, page = markdown(pm), html(pm)
    assert "Confidence: **probable**" in md and "To confirm: the host kernel log" in md
    assert "confidence: <b>probable</b>; to confirm: the host kernel log" in page
    oom = judge(
        _evidence(
            exit_status=137, exit_status_at=T0 + 30, run_state="exited", probe=_oom(4242, T0 + 29)
        )
    ).verdict
    assert (oom.confidence, oom.confirm) == ("certain", "")


def test_the_terminal_verdict_shows_confidence_and_confirm() -> None:
    from rich.console import Console

    from orchestrator.views.postmortem import print_verdict

    console = Console(record=True, width=200, color_system=None)
    print_verdict(
        console,
        judge(
            _evidence(
                exit_status=137, exit_status_at=T0 + 30, run_state="exited", log_tail=("Killed",)
            )
        ),
    )
    text = console.export_text()
    assert "\nconfidence: probable\n" in text and "\nconfirm: the host kernel log" in text
