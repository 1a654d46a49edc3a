"""Exporter metric families (pure) and the atomic textfile, parsed back with prometheus-client."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from orchestrator.monitor.judge import Judgement
from orchestrator.views import export
from orchestrator.wire.model import Finding, Metrics, Severity, Snapshot
from tests.views.snapshots import TOTAL_MIB, gpus, running

RULES = Path(__file__).resolve().parents[2] / "playbooks" / "prometheus-rules.yaml"


class Fixed:
    """A poller stand-in holding fixed observations (the collector only calls ``latest``)."""

    def __init__(self, observed):
        self.observed = observed

    def latest(self):
        return self.observed


def scrape(observed) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(export.FleetCollector(Fixed(observed)))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_dcgm_names_and_labels():
    snap = running("ct200", gpus=gpus({3: 100.0}, {0: 1024.0}))
    got = scrape([Judgement("ct200", snap, "running", host="pve1")])
    used = {s.labels["gpu"]: s for s in got["DCGM_FI_DEV_FB_USED"]}
    assert len(used) == 8
    assert used["0"].value == 1024.0
    assert used["0"].labels == {
        "gpu": "0",
        "UUID": "GPU-00000000",
        "pci_bus_id": "",
        "device": "nvidia0",
        "modelName": "NVIDIA H200",
        "Hostname": "pve1",
        "container": "ct200",
        "DCGM_FI_DRIVER_VERSION": "",
    }
    free = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_FB_FREE"]}
    assert free["0"] == TOTAL_MIB - 1024.0
    util = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_GPU_UTIL"]}
    assert util["3"] == 100.0
    assert {s.value for s in got["DCGM_FI_DEV_GPU_TEMP"]} == {40.0}
    assert {s.value for s in got["DCGM_FI_DEV_POWER_USAGE"]} == {90.0}


def test_run_and_finding_gauges():
    ghost = Finding("ghost-utilization", Severity.CRITICAL, "ct200", "x", gpus=(3,))
    crashed = running("ct201", exit_status=137, pane_dead=True)
    got = scrape(
        [
            Judgement("ct200", running("ct200"), "running", (ghost,), host="pve1"),
            Judgement("ct201", crashed, "crashed", (), host="pve1"),
        ]
    )
    up = {s.labels["target"]: s.value for s in got["orch_run_up"]}
    assert up == {"ct200": 1.0, "ct201": 0.0}
    assert {s.labels["target"]: s.value for s in got["orch_run_exit_status"]} == {"ct201": 137.0}
    assert {s.labels["target"]: s.value for s in got["orch_run_step"]} == {
        "ct200": 120.0,
        "ct201": 120.0,
    }
    assert got["orch_run_tokens_per_second"][0].value == 21500.0
    assert got["orch_run_throughput"] == []  # the fixture's Metrics name no unit
    [f] = got["orch_finding"]
    assert f.labels == {
        "target": "ct200",
        "host": "pve1",
        "Hostname": "pve1",
        "container": "ct200",
        "kind": "ghost-utilization",
        "severity": "critical",
        "gpus": "3",
    }


def test_unreachable_target_has_no_gpu_series_and_reachable_zero():
    down = Snapshot.unreachable("ct200", 5.0, "connection refused")
    got = scrape([Judgement("ct200", down, "unreachable", (), host="pve1")])
    assert got["orch_target_reachable"][0].value == 0.0
    assert got.get("DCGM_FI_DEV_FB_USED", []) == []
    assert got.get("orch_run_up", []) == []


def test_every_metric_the_rules_use_is_exported():
    snap = running("ct200", exit_status=1)
    ghost = Finding("xid", Severity.CRITICAL, "ct200", "x")
    names = set(scrape([Judgement("ct200", snap, "crashed", (ghost,), host="pve1")]))
    used = set(re.findall(r"\b(DCGM_FI_\w+|orch_\w+)", RULES.read_text()))
    assert used and used <= names, used - names


def test_textfile_is_written_atomically(tmp_path):
    """write_to_textfile writes a temp file then renames: no reader ever sees half a file."""
    from prometheus_client import write_to_textfile

    path = tmp_path / "orch.prom"
    poller = Fixed([Judgement("ct200", running("ct200"), "running", (), host="pve1")])
    write_to_textfile(str(path), export.registry_for(poller))  # type: ignore[arg-type]
    text = path.read_text()
    assert 'DCGM_FI_DEV_FB_USED{DCGM_FI_DRIVER_VERSION="",Hostname="pve1"' in text
    assert [p.name for p in tmp_path.iterdir()] == ["orch.prom"]  # no temp left behind


@pytest.mark.parametrize("bad", ["9400", "host:", "h:99999", "h:x"])
def test_bad_listen_is_rejected(bad):
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        export.parse_listen(bad)


def test_throughput_gauge_keeps_the_printed_unit() -> None:
    """A torchtitan run's tps is tokens/s per device: ``orch_run_throughput{unit=...}``, never
    the tokens gauge (a rate is not relabelled)."""
    import dataclasses

    snap = running("ct200")
    snap = dataclasses.replace(
        snap,
        metrics=Metrics(
            step=250,
            loss=5.8,
            throughput=5862.0,
            throughput_unit="tokens/s/device",
            total_steps=1000,
            framework="torchtitan",
        ),
    )
    got = scrape([Judgement("ct200", snap, "running", (), host="pve1")])
    [rate] = got["orch_run_throughput"]
    assert rate.labels == {
        "target": "ct200",
        "host": "pve1",
        "Hostname": "pve1",
        "container": "ct200",
        "unit": "tokens/s/device",
    }
    assert rate.value == 5862.0
    assert got["orch_run_tokens_per_second"] == []
    assert got["orch_run_total_steps"][0].value == 1000.0


def test_xid_errors_driver_version_and_bus_id_as_dcgm_exporter_has_them() -> None:
    """DCGM_FI_DEV_XID_ERRORS is the last Xid the host observer placed on that GPU (0: none);
    pci_bus_id and DCGM_FI_DRIVER_VERSION label every GPU series (dcgm-exporter's
    render_metrics.go and etc/default-counters.csv)."""
    import dataclasses

    from orchestrator.wire.model import KernelEvent, NvmlStatus

    base = gpus({i: 90.0 for i in range(8)}, {i: 70000.0 for i in range(8)})
    bused = tuple(
        dataclasses.replace(
            g, pci_bus_id=f"00000000:{0x18 + g.index:02X}:00.0", host_index=g.index + 8
        )
        for g in base
    )
    events = (
        KernelEvent("xid", "NVRM: Xid (PCI:0000:1b:00): 13, ...", xid=13, pci="0000:1b:00"),
        KernelEvent("xid", "NVRM: Xid (PCI:0000:1b:00): 48, ...", xid=48, pci="0000:1b:00"),
        KernelEvent("xid", "NVRM: Xid (PCI:0000:99:00): 79, ...", xid=79, gpu=13),
        KernelEvent("oom-killer", "oom-kill:...", pid=5),
    )
    snap = running(
        "ct200",
        gpus=bused,
        kernel_events=events,
        nvml=NvmlStatus(ok=True, source="nvml", driver_version="570.172.08"),
    )
    got = scrape([Judgement("ct200", snap, "running", host="pve1")])
    xid = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_XID_ERRORS"]}
    assert xid == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 48.0, "4": 0.0, "5": 79.0, "6": 0.0, "7": 0.0}
    used = {s.labels["gpu"]: s.labels for s in got["DCGM_FI_DEV_FB_USED"]}
    assert used["3"]["pci_bus_id"] == "00000000:1B:00.0"
    assert {lab["DCGM_FI_DRIVER_VERSION"] for lab in used.values()} == {"570.172.08"}


def test_orch_series_join_the_gpu_series_on_dcgm_labels() -> None:
    """Every orch_* series of a target has the Hostname and container of its GPUs' series."""
    got = scrape([Judgement("ct200", running("ct200"), "running", host="pve1")])
    gpu_keys = {(s.labels["Hostname"], s.labels["container"]) for s in got["DCGM_FI_DEV_GPU_UTIL"]}
    for name, samples in got.items():
        if name.startswith("orch_"):
            assert {(s.labels["Hostname"], s.labels["container"]) for s in samples} <= gpu_keys


def test_the_mapping_table_names_every_dcgm_series_exported() -> None:
    doc = (RULES.parents[1] / "docs" / "prometheus.md").read_text()
    names = {f.name for f in export.families([]) if f.name.startswith("DCGM_FI_")}
    rows = set(re.findall(r"^\| (DCGM_FI_\w+) \| same \|", doc, re.M))
    assert names and names == rows, names ^ rows


def test_each_dcgm_field_is_its_sample_field_and_a_missing_one_no_series():
    import dataclasses

    base = gpus({}, {})
    full = dataclasses.replace(
        base[0],
        sm_clock_mhz=1410.0,
        memory_temp_c=71.0,
        energy_mj=5e9,
        row_remap_failure=True,
        nvlink_bandwidth_mib_s=3000.0,
    )
    snap = running("ct200", gpus=(full, base[1]))
    got = scrape([Judgement("ct200", snap, "running", host="pve1")])
    for name, field in [(n, a) for n, _h, a in export.DCGM_MORE]:
        want = getattr(full, field)
        values = {s.labels["gpu"]: s.value for s in got.get(name, [])}
        assert values == ({"0": float(want)} if want is not None else {}), (name, values)
    assert {s.labels["gpu"] for s in got["DCGM_FI_DEV_GPU_UTIL"]} == {"0", "1"}


def test_every_default_dcgm_counter_nvml_gives_is_exported_with_dcgms_labels():
    from tests.views.dcgm_defaults import FROM_NVML, GPU_LABELS

    fams = [f for f in export.families([]) if f.name.startswith("DCGM_FI_")]
    assert sorted(f.name for f in fams) == sorted(FROM_NVML)
    assert set(export.DCGM_LABELS) == GPU_LABELS
