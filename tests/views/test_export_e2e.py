"""A real Prometheus server scrapes ``orch export --listen`` over the sandbox; ``--textfile`` too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.mark.skipif(
    not Path(PROMETHEUS).exists(), reason="prometheus not installed (apt: prometheus)"
)
def test_prometheus_scrapes_dcgm_names_from_the_sandbox(fleet, tmp_path):
    fleet.scenario("healthy")
    export_port, prom_port = free_port(), free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            fleet.config,
            "export",
            "--listen",
            f"127.0.0.1:{export_port}",
            "--interval",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: orch\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{export_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        metrics_url = f"http://127.0.0.1:{export_port}/metrics"
        wait_for(lambda: "DCGM_FI_DEV_FB_USED{" in _try(get, metrics_url), 60, what="exporter data")
        query = urllib.parse.urlencode({"query": "DCGM_FI_DEV_FB_USED"})
        api = f"http://127.0.0.1:{prom_port}/api/v1/query?{query}"

        def series():
            doc = json.loads(_try(get, api) or "{}")
            return doc.get("data", {}).get("result", []) if doc.get("status") == "success" else []

        result = wait_for(
            lambda: len(series()) == 16 and series(), 90, 0.5, "16 GPU series in Prometheus"
        )
        labels = [r["metric"] for r in result]
        assert {(m["container"], m["gpu"]) for m in labels} == {
            (c, str(g)) for c in ("ct200", "ct201") for g in range(8)
        }
        assert all(m["Hostname"] == "sandbox" and m["UUID"] and m["modelName"] for m in labels)
        assert all(m["job"] == "orch" for m in labels)
        assert all(re.fullmatch(r"0{8}:[0-9A-F]{2}:00\.0", m["pci_bus_id"]) for m in labels)
        assert {m["DCGM_FI_DRIVER_VERSION"] for m in labels} == {"570.172.08"}  # fakenvml.c
        up = json.loads(
            get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=orch_target_reachable")
        )
        assert sorted(float(r["value"][1]) for r in up["data"]["result"]) == [1.0, 1.0]
        # orch's series join dcgm's on their own labels, no label_replace
        join = "DCGM_FI_DEV_GPU_UTIL * on (Hostname, container) group_left orch_target_reachable"
        joined = json.loads(
            get(
                f"http://127.0.0.1:{prom_port}/api/v1/query?"
                + urllib.parse.urlencode({"query": join})
            )
        )
        assert len(joined["data"]["result"]) == 16, joined
        xid = json.loads(
            get(
                f"http://127.0.0.1:{prom_port}/api/v1/query?"
                + urllib.parse.urlencode({"query": "DCGM_FI_DEV_XID_ERRORS"})
            )
        )
        assert sorted(float(r["value"][1]) for r in xid["data"]["result"]) == [0.0] * 16
    finally:
        stop(prom)
        stop(exporter)
    assert exporter.returncode in (0, -15), exporter.stderr.read()


@pytest.mark.parametrize("observe", ["host", "container"])
def test_textfile_once_for_node_exporter(fleet, tmp_path, observe):
    fleet.scenario("ghost")
    try:
        path = tmp_path / "orch.prom"
        proc = fleet.orch(
            "export", "--textfile", str(path), config=fleet.config_for(observe, tmp_path)
        )
        assert proc.returncode == 0, proc.stderr
        text = path.read_text()
        assert 'Hostname="sandbox",UUID="GPU-' in text and "DCGM_FI_DEV_XID_ERRORS{" in text
        util3 = [
            line
            for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'gpu="3"' in line
        ]
        assert util3 and all(line.endswith(" 100.0") for line in util3)
        assert [p.name for p in tmp_path.iterdir() if p.suffix != ".yaml"] == ["orch.prom"]
    finally:
        fleet.scenario("healthy")


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError:
        return ""


def _xid_samples(text: str) -> dict[tuple[str, str], tuple[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {
        (s.labels["container"], s.labels["gpu"]): (s.labels["pci_bus_id"], s.value)
        for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples
    }


def test_an_injected_xid_is_dcgm_xid_errors_on_its_gpu(fleet, tmp_path):
    """An Xid line in the host's kernel log naming ct200's GPU 3 by PCI address (a GPU no
    process holds: a host event): that device's DCGM_FI_DEV_XID_ERRORS is its code, as
    dcgm-exporter reports a device's Xid whoever uses it; the other GPUs stay 0."""
    from orchestrator.sandbox import kernel

    fleet.scenario("healthy")
    fleet.launch("ct200")
    config = fleet.config_for("host", tmp_path)
    path = tmp_path / "orch.prom"
    assert fleet.orch("export", "--textfile", str(path), config=config).returncode == 0
    before = _xid_samples(path.read_text())
    assert {v for _, v in before.values()} == {0.0}, before
    bus = before[("ct200", "3")][0]
    domain, b, dev = bus.split(".")[0].split(":")
    kernel.append_kernel_line(
        fleet.state_dir,
        f"NVRM: Xid (PCI:{int(domain, 16):04x}:{b.lower()}:{dev}): 48, pid='<unknown>', "
        "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU.",
        level=3,
    )  # the format of open-gpu-kernel-modules' nvErrorLog (kernel-open/nvidia, 570.x)
    assert fleet.orch("export", "--textfile", str(path), config=config).returncode == 0
    after = _xid_samples(path.read_text())
    assert after[("ct200", "3")] == (bus, 48.0), after
    # the sandbox's two containers see the same GPUs: the device's series in each say it
    hit = {k for k, (pci, _) in after.items() if pci == bus}
    assert ("ct200", "3") in hit and {k for k, (_, v) in after.items() if v} == hit, after


def test_host_and_container_paths_export_the_same_dcgm_series(fleet, tmp_path):
    """The host observer reads the GPUs once and fans them out; the in-container agent reads
    its own: one-shot, both give every NVML default counter but NVLink bandwidth (a rate
    needs a previous reading of the same collector), with the same values where they are
    moving."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.views.dcgm_defaults import FROM_NVML

    fleet.scenario("healthy")
    seen = {}
    for observe in ("host", "container"):
        path = tmp_path / f"{observe}.prom"
        proc = fleet.orch(
            "export", "--textfile", str(path), config=fleet.config_for(observe, tmp_path)
        )
        assert proc.returncode == 0, proc.stderr
        seen[observe] = {
            (s.name, s.labels["container"], s.labels["gpu"]): s.value
            for f in text_string_to_metric_families(path.read_text())
            if f.name.startswith("DCGM_FI_")
            for s in f.samples
        }
    host, container = seen["host"], seen["container"]
    assert set(host) == set(container)
    assert {n for n, _, _ in host} == set(FROM_NVML) - {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
    assert len(host) == 16 * (len(FROM_NVML) - 1)
    # energy grows between the two exports; an Xid an earlier test injected stays in the log
    moving = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS"}
    steady = {k: v for k, v in host.items() if k[0] not in moving}
    assert steady == {k: container[k] for k in steady}
