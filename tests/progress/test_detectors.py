"""Stall and throughput-drop on the user's own frameworks: log lines in HF Trainer's,
torchtitan's and nanoGPT's real formats go through the agent's parser into snapshots, then
through the detectors (pure; the sandbox e2e is tests/progress/test_frameworks_e2e.py)."""

from __future__ import annotations

from orchestrator.agent.metrics import MetricParser
from orchestrator.agent.runfacts import merge_metrics
from orchestrator.config.limits import Limits
from orchestrator.detect.run import stall
from orchestrator.detect.throughput import throughput_drop
from orchestrator.wire.model import (
    GpuSample,
    Metrics,
    ProcessInfo,
    RunManifest,
    RunState,
    SessionState,
    Snapshot,
)

T0 = 1_764_410_400.0
MANIFEST = RunManifest("r1", "python3 train.py", "/root/orch", "train", T0)


def _snaps(chunks: list[list[str]], every_s: float = 10.0) -> list[Snapshot]:
    """One snapshot per chunk of new log lines, read by one agent-side parser."""
    parser, last, out = MetricParser(), None, []
    for i, lines in enumerate(chunks):
        at = T0 + 60 + i * every_s
        m = parser.parse(lines, now=at)
        last = merge_metrics(last, m) if m is not None else last
        out.append(
            Snapshot(
                target="ct1",
                taken_at=at,
                session=SessionState("train", True, pane_dead=False),
                run=RunState(
                    "r1",
                    "/root/orch/runs/r1",
                    manifest=MANIFEST,
                    new_log_lines=tuple(lines),
                    log_mtime=at if lines else T0 + 60,
                ),
                processes=(ProcessInfo(pid=100, ppid=1, name="python3", state="S"),),
                gpus=(
                    GpuSample(
                        index=0,
                        uuid="GPU-0",
                        name="H200",
                        utilization_pct=0.0,
                        memory_used_mib=70000.0,
                        memory_total_mib=143771.0,
                    ),
                ),
                metrics=last if lines else None,
            )
        )
    return out


def _hf_bar(step: int, rate: float, total: int = 1000) -> str:
    """transformers' training bar: tqdm(total=state.max_steps), no description."""
    pct = step * 100 // total
    return f" {pct:>2}%|##        | {step}/{total} [01:00<05:00, {rate:5.2f}it/s]"


def _titan(step: int, tps: int) -> str:
    """torchtitan components/metrics.py MetricsProcessor.log (colours stripped by the reader)."""
    return (
        f"[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - \x1b[31mstep: {step:2}  "
        f"\x1b[32mloss:  6.1384  \x1b[33mmemory: 49.66GiB(52.28%)  \x1b[34mtps: {tps:,}  "
        f"\x1b[36mtflops: 339.16  \x1b[35mmfu: 34.29%\x1b[39m"
    )


def test_hf_trainer_it_per_s_drop_fires_in_its_unit() -> None:
    chunks = [
        [_hf_bar(10 * i, 2.5), "{'loss': '2.1', 'learning_rate': '5e-05', 'epoch': 0.1}"]
        for i in range(1, 8)
    ]
    chunks += [[_hf_bar(70 + i, 0.5)] for i in range(1, 4)]
    [f] = throughput_drop(_snaps(chunks), Limits())
    assert f.summary.startswith("it/s fell to 0.50 from a baseline of 2.50"), f.summary
    assert "it/s" in f.evidence[0]


def test_hf_evaluation_bar_is_not_the_training_rate() -> None:
    """The eval bar has no description either; its total is not the training bar's."""
    chunks = [[_hf_bar(10 * i, 2.5)] for i in range(1, 8)]
    chunks += [[f"{i * 10}%|#  | {i}/63 [00:0{i}<00:05, 11.20it/s]"] for i in range(1, 4)]
    snaps = _snaps(chunks)
    assert throughput_drop(snaps, Limits()) == []
    m = snaps[-1].metrics
    assert m is not None and (m.step, m.total_steps, m.throughput) == (70, 1000, 2.5)


def test_a_unit_change_never_reads_as_a_drop() -> None:
    """Training's tokens/s per device, then lines that only give a time per step."""
    snaps = _snaps([[_titan(10 * i, 5862)] for i in range(1, 8)])
    later = [
        Snapshot(
            target="ct1",
            taken_at=snaps[-1].taken_at + 10 * i,
            metrics=Metrics(
                step=80 + i,
                throughput=30.0,
                throughput_unit="s/step",
                seen_at=snaps[-1].taken_at + 10 * i,
            ),
        )
        for i in range(1, 4)
    ]
    assert throughput_drop([*snaps, *later], Limits()) == []


def test_torchtitan_tps_drop_fires_and_never_as_tokens_per_s() -> None:
    chunks = [[_titan(10 * i, 5862)] for i in range(1, 8)]
    chunks += [[_titan(70 + i, 1_200)] for i in range(1, 4)]
    snaps = _snaps(chunks)
    assert snaps[-1].metrics is not None and snaps[-1].metrics.tokens_per_s is None
    [f] = throughput_drop(snaps, Limits())
    assert f.summary.startswith("tokens/s/device fell to 1,200 from a baseline of 5,862")


def test_a_longer_time_per_step_is_a_drop() -> None:
    """nanoGPT prints a time per iteration: 95 ms -> 480 ms is a fall in steps/s."""
    chunks = [[f"iter {i}: loss 3.1000, time 95.00ms, mfu 40.00%"] for i in range(1, 8)]
    chunks += [[f"iter {i}: loss 3.1000, time 480.00ms, mfu 8.00%"] for i in range(8, 11)]
    [f] = throughput_drop(_snaps(chunks), Limits())
    assert f.summary.startswith("steps/s (from s/step) fell to"), f.summary


def test_stall_on_torchtitan_steps() -> None:
    """Steps 10..30, then a quiet log for longer than stall_timeout_s: a stall."""
    snaps = _snaps([[_titan(10 * i, 5862)] for i in range(1, 4)] + [[]] * 3, every_s=300.0)
    [f] = stall(snaps, Limits(stall_timeout_s=600.0))
    assert f.kind == "stall"
    assert snaps[2].metrics is not None and snaps[2].metrics.framework == "torchtitan"
    quiet = stall(snaps[:4], Limits(stall_timeout_s=600.0))
    assert quiet == []
