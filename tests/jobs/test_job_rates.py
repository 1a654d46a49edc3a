"""A job's throughput is summed per unit: per-device rates count the node's devices, units
never mix (monitor/job_rates.py, monitor/jobs.py). Pure: recorded node states."""

from __future__ import annotations

from orchestrator.config.inventory import parse_inventory
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import Judgement
from orchestrator.wire.model import GpuSample, Metrics, Snapshot

T0 = 1_800_000_000.0
BASE = (
    "hosts: {pve1: {address: 10.1.2.6}, pve2: {address: 10.1.2.7}}\n"
    "containers:\n"
    "  ct200: {host: pve1, vmid: 200, address: 10.99.0.10}\n"
    "  ct201: {host: pve2, vmid: 201, address: 10.99.0.11}\n"
)


def _judge(jobs_yaml: str, metrics: dict[str, Metrics], gpus: int = 0) -> JobJudgement:
    inv = parse_inventory(BASE + jobs_yaml)
    job = inv.job("pair")
    samples = tuple(GpuSample(index=i) for i in range(gpus))
    judgements = {
        name: Judgement(
            name,
            Snapshot(name, T0, metrics=m, gpus=samples),
            "running",
            (),
            host=inv.container(name).host,
        )
        for name, m in metrics.items()
    }
    return judge_job(job, {n: inv.container(n) for n in job.containers}, judgements)


def _tt(tps: float) -> Metrics:
    """torchtitan's tps: tokens per second per device (progress reader ``torchtitan``)."""
    return Metrics(step=10, throughput=tps, throughput_unit="tokens/s/device")


def test_per_device_tokens_count_each_nodes_gpus() -> None:
    jj = _judge(
        "jobs: {pair: {nodes: [ct200, ct201], gpus: {train: [0, 1, 2, 3]}}}\n",
        {"ct200": _tt(5862.0), "ct201": _tt(5600.0)},
    )
    assert jj.tokens_per_s == 4 * 5862.0 + 4 * 5600.0
    assert [r.tokens_per_s for r in jj.nodes] == [4 * 5862.0, 4 * 5600.0]
    assert [(r.unit, r.how, r.nodes) for r in jj.throughput] == [("tokens/s", "sum", 2)]
    assert jj.to_dict()["throughput"] == [
        {"value": 45848.0, "unit": "tokens/s", "nodes": 2, "how": "sum"}
    ]


def test_the_gpus_a_snapshot_sees_count_when_the_job_names_none() -> None:
    jj = _judge("jobs: {pair: {nodes: [ct200, ct201]}}\n", {"ct200": _tt(100.0)}, gpus=8)
    assert jj.tokens_per_s == 800.0 and jj.nodes[0].devices == 8


def test_without_a_device_count_the_rate_stays_per_device() -> None:
    jj = _judge(
        "jobs: {pair: {nodes: [ct200, ct201]}}\n", {"ct200": _tt(900.0), "ct201": _tt(1100.0)}
    )
    assert jj.tokens_per_s is None  # 2000 "tokens/s" would be a made-up figure
    assert [(r.value, r.unit, r.how) for r in jj.throughput] == [
        (1000.0, "tokens/s/device", "mean per device")
    ]


def test_two_units_are_never_added() -> None:
    jj = _judge(
        "jobs: {pair: {nodes: [ct200, ct201]}}\n",
        {
            "ct200": Metrics(step=5, tokens_per_s=21500.0),  # an older agent: tokens/s only
            "ct201": Metrics(step=5, throughput=64.0, throughput_unit="samples/s"),
        },
    )
    assert jj.tokens_per_s == 21500.0
    assert {(r.unit, r.value) for r in jj.throughput} == {
        ("tokens/s", 21500.0),
        ("samples/s", 64.0),
    }


def test_a_step_rate_is_the_slowest_nodes_not_a_sum() -> None:
    jj = _judge(
        "jobs: {pair: {nodes: [ct200, ct201]}}\n",
        {
            "ct200": Metrics(step=5, throughput=3.2, throughput_unit="it/s"),
            "ct201": Metrics(step=5, throughput=2.9, throughput_unit="it/s"),
        },
    )
    assert [(r.value, r.unit, r.how) for r in jj.throughput] == [(2.9, "it/s", "slowest node")]
    assert jj.tokens_per_s is None
