"""A postmortem with everything the report must draw well, from hand-built evidence (pure).

Four GPUs sampled every 2 s by the flight recorder (``agent/record.py``'s line: ``t``, ``gpus``,
``procs``): the run's GPUs 0-1 busy at ~60 GiB, GPU 2 idle and empty all along, GPU 3 a ghost
(100 %, 0 MiB) from +30 s to +50 s that cleared before the crash; the recorder paused from
+60 s to +78 s (a gap), the run died at +90 s with exit status 1, and the postmortem's own
final reading is at +200 s (alone after a gap). The first finding (the crash) is on the death's instant: two markers at
one x.
"""

from __future__ import annotations

from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import Postmortem, judge
from orchestrator.wire.model import GpuSample, ProcessInfo, RunManifest, Snapshot

T0 = 1_700_000_000.0
PAUSE = (60.0, 78.0)
GHOST = (30.0, 50.0)
DEATH = 90.0


def _gpu(index: int, util: float, mem: float) -> dict:  # type: ignore[type-arg]
    return GpuSample(
        index=index, utilization_pct=util, memory_used_mib=mem, power_w=110.0, processes=()
    ).to_dict()


def _sample(t: float) -> dict:  # type: ignore[type-arg]
    ghost = GHOST[0] <= t <= GHOST[1]
    return {
        "t": T0 + t,
        "gpus": [
            _gpu(0, 92 + t % 7, 61_000 + 10 * t),
            _gpu(1, 88 + t % 5, 60_500 + 9 * t),
            _gpu(2, 0, 0),
            _gpu(3, 100 if ghost else 0, 0),
        ],
        "procs": [ProcessInfo(pid=4242, ppid=1, name="python3", state="S").to_dict()],
    }


def evidence() -> Evidence:
    times = [t for t in range(2, int(DEATH) + 1, 2) if not PAUSE[0] < t < PAUSE[1]]
    manifest = RunManifest(
        run_id="r1",
        command="python3 train.py",
        workdir="/w",
        session="train",
        started_at=T0,
        gpus=(0, 1),
    )
    metrics = tuple({"time": T0 + t, "step": t, "tok_s": 21_000.0 + 40 * (t % 9)} for t in times)
    return Evidence(
        target="ct200",
        collected_at=T0 + 200,
        run_id="r1",
        run_dir="/w/runs/r1",
        manifest=manifest,
        container_status="running",
        exit_status=1,
        exit_status_at=T0 + DEATH,
        run_state="exited",
        log_exists=True,
        log_tail=("step=88 loss=2.0 tok/s=21500", "RuntimeError: boom"),
        gpu_history=tuple(_sample(float(t)) for t in times),
        metrics=metrics,
        final=Snapshot(
            target="ct200",
            taken_at=T0 + 200,
            gpus=tuple(GpuSample.from_dict(_gpu(i, 0, 0)) for i in range(4)),
        ),
        agent={
            "session": "train",
            "tmux_server_running": True,
            "state": {"state": "exited", "tmux": {"exists": True, "pane_dead": True}},
        },
    )


def postmortem(finding_before_death_s: float = 0.0) -> Postmortem:
    """The case's postmortem; its first finding (the crash, on the death's instant) moved
    ``finding_before_death_s`` earlier."""
    pm = judge(evidence())
    if not finding_before_death_s:
        return pm
    from dataclasses import replace

    moved = tuple(replace(f, since=T0 + DEATH - finding_before_death_s) for f in pm.findings)
    return replace(pm, findings=moved)
