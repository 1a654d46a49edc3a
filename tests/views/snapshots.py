"""Hand-built snapshots for the views tests (the wire dataclasses, no I/O)."""

from __future__ import annotations

from orchestrator.wire.model import (
    GpuSample,
    Metrics,
    RunManifest,
    RunState,
    SessionState,
    Snapshot,
)

TOTAL_MIB = 143771.0


def gpus(util: dict[int, float] | None = None, mem: dict[int, float] | None = None, n: int = 8):
    util, mem = util or {}, mem or {}
    return tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-{i:08d}",
            name="NVIDIA H200",
            utilization_pct=util.get(i, 0.0),
            memory_used_mib=mem.get(i, 0.0),
            memory_total_mib=TOTAL_MIB,
            temperature_c=40.0,
            power_w=90.0,
        )
        for i in range(n)
    )


def running(
    target: str = "ct200",
    at: float = 1000.0,
    step: int = 120,
    tps: float = 21500.0,
    exit_status: int | None = None,
    pane_dead: bool = False,
    **kw,
) -> Snapshot:
    manifest = RunManifest(
        "r-20250101-1200", "python -m trainer", "/root/orch", "train", at - 600.0
    )
    return Snapshot(
        target=target,
        taken_at=at,
        session=SessionState("train", True, pane_dead=pane_dead, pane_tail=("step 120 loss 2.1",)),
        run=RunState(
            "r-20250101-1200",
            "/root/orch/runs/r-20250101-1200",
            manifest=manifest,
            exit_status=exit_status,
            new_log_lines=(f"step {step} loss 2.1",),
        ),
        gpus=kw.pop("gpus", gpus({i: 90.0 for i in range(8)}, {i: 70000.0 for i in range(8)})),
        metrics=Metrics(step=step, loss=2.1, tokens_per_s=tps),
        **kw,
    )
