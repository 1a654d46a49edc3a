"""What orch's monitor makes of the bundled trainer's symptoms, pure (no sandbox, no I/O).

The e2e half is tests/contract/test_trainer_contract.py; these pin the same rules on
hand-built snapshots and evidence so they fail fast and without a sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.limits import Limits
from orchestrator.detect.engine import run_detectors
from orchestrator.playbooks.loader import load_playbooks, match_log
from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import judge
from orchestrator.wire.model import GpuSample, ProcessInfo, RunManifest, Snapshot

CASES = Path(__file__).resolve().parents[1] / "detect"
T0 = 1_700_000_000.0


def _case(rel: str) -> tuple[list[Snapshot], Limits]:
    doc = json.loads((CASES / rel).read_text())
    return [Snapshot.from_dict(s) for s in doc["snapshots"]], Limits().merged(doc.get("limits", {}))


def test_check_offset_stall_names_the_step_of_an_older_snapshot() -> None:
    snaps, limits = _case("stall/check_offset_keeps_last_step.json")
    assert snaps[-1].metrics is None  # the newest check read no line
    (f,) = run_detectors(snaps, limits=limits)
    assert f.kind == "stall" and "last step 47" in f.evidence, f.evidence


def test_no_step_yet_uses_the_startup_grace_then_stalls() -> None:
    snaps, limits = _case("healthy/startup_no_step_within_grace.json")
    assert run_detectors(snaps, limits=limits) == []
    later = snaps[-1].taken_at + limits.startup_grace_s
    (f,) = run_detectors(snaps, limits=limits, now=later)
    assert f.kind == "stall" and "startup grace" in f.summary, f.summary
    # once a step (or the trainer's heartbeat) is seen, the plain timeout applies
    beat = Snapshot.from_dict(
        {**snaps[-1].to_dict(), "run": {**snaps[-1].run.to_dict(), "heartbeat_age_s": 50.0}}  # type: ignore[union-attr]
    )
    assert [f.kind for f in run_detectors([*snaps[:-1], beat], limits=limits)] == ["stall"]


def test_silent_exit_is_a_warning_and_a_non_trainer_exit_0_is_not() -> None:
    snaps, limits = _case("finished/trainer_silent_exit0.json")
    (f,) = run_detectors(snaps, limits=limits)
    assert (f.kind, str(f.severity)) == ("finished", "warning")
    assert "exited 0 at step 3" in f.summary and "last step 3" in f.evidence
    d = snaps[-1].to_dict()
    d["run"]["manifest"]["command"] = "python3 train.py"  # not the bundled trainer: no contract
    (g,) = run_detectors([Snapshot.from_dict(d)], limits=limits)
    assert (g.kind, str(g.severity)) == ("finished", "info")
    d = snaps[-1].to_dict()
    d["session"]["pane_tail"] = []  # the end of the output unknown: no guess
    (h,) = run_detectors([Snapshot.from_dict(d)], limits=limits)
    assert (h.kind, str(h.severity)) == ("finished", "info")


def _gpu() -> dict:
    return GpuSample(index=0, utilization_pct=0.0, memory_used_mib=0.0).to_dict()


def _proc() -> dict:
    return ProcessInfo(pid=4242, ppid=1, name="python3", state="S").to_dict()


def _hung_evidence(**kw) -> Evidence:  # type: ignore[no-untyped-def]
    """A live run that logged step 47 at T0+60 and hung; the recorder sampled every 10 s."""
    manifest = RunManifest(
        run_id="r1",
        command="python3 -m trainer",
        workdir="/w",
        session="train",
        started_at=T0,
        gpus=(),
    )
    base = dict(
        target="ct200",
        collected_at=T0 + 200,
        run_id="r1",
        run_dir="/w/runs/r1",
        manifest=manifest,
        container_status="running",
        log_exists=True,
        log_mtime=T0 + 60,
        log_tail=("step=47 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04 gpu_mem=-",),
        gpu_history=tuple(
            {"t": T0 + t, "gpus": [_gpu()], "procs": [_proc()]} for t in range(10, 200, 10)
        ),
        metrics=({"time": T0 + 60, "step": 47, "tok_s": 21500.0},),
        agent={
            "session": "train",
            "tmux_server_running": True,
            "heartbeat": {"age_s": 140.0},
            "state": {
                "state": "running",
                "command_pids": [4242],
                "tmux": {"exists": True, "pane_dead": False},
            },
        },
    )
    base.update(kw)
    return Evidence(**base)  # type: ignore[arg-type]


def test_hung_live_run_postmortem_verdict_is_the_stall() -> None:
    pm = judge(_hung_evidence(), limits=Limits(stall_timeout_s=60))
    assert pm.verdict.kind == "stall", pm.verdict
    assert "last step 47" in pm.verdict.evidence
    # the tail rides on the first recorder sample after the log's mtime, not the final state
    carrying = [s.taken_at for s in pm.history if s.run is not None and s.run.new_log_lines]
    assert carrying == [T0 + 60]


def test_a_log_written_after_the_last_sample_is_progress() -> None:
    pm = judge(_hung_evidence(log_mtime=T0 + 195), limits=Limits(stall_timeout_s=60))
    assert pm.verdict.kind != "stall", pm.verdict


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        (
            [
                '  File "train.py", line 9, in step',
                "    except torch.cuda.OutOfMemoryError:",
                "ValueError: bad shape",
            ],
            [],
        ),
        (
            ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5"],
            ["cuda-oom"],
        ),
        (["[rank0]: torch.cuda.OutOfMemoryError: out of device memory"], ["cuda-oom"]),
    ],
)
def test_cuda_oom_matches_the_message_not_a_quoted_source_line(
    lines: list[str], want: list[str]
) -> None:
    assert [m.id for m in match_log(lines, load_playbooks())] == want


def test_silent_exit_from_a_log_read_to_its_end_only() -> None:
    snaps, limits = _case("finished/trainer_silent_exit0_log_read.json")
    (f,) = run_detectors(snaps, limits=limits)
    assert (f.kind, str(f.severity)) == ("finished", "warning"), f.summary
    d = snaps[-1].to_dict()
    d["run"]["log_offset"] = 100  # a piece of the log, not its end: the line may follow
    (g,) = run_detectors([Snapshot.from_dict(d)], limits=limits)
    assert (g.kind, str(g.severity)) == ("finished", "info")
