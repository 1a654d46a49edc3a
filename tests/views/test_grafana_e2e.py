"""A real Prometheus scrapes ``orch export --listen`` over a sandbox of its own (two containers,
eight GPUs, the ghost scenario, a trainer on ct200, an Xid in the host's kernel log):

- it holds every dcgm-exporter default counter NVML gives, with dcgm-exporter's names and
  labels, on every GPU of both containers, and a field a GPU lacks goes away from Prometheus;
- every query of the shipped Grafana dashboard (docs/grafana/orch-fleet.json), its variables
  put in as Grafana would for "All", returns series carrying the labels its legend names.

Its own sandbox: the Xid it injects stays in the kernel log, which other tests read.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SANDBOX_ISOLATION, free_port, wait_for
from tests.views.conftest import ROOT, Fleet
from tests.views.dcgm_defaults import FROM_NVML, GPU_LABELS
from tests.views.test_export_e2e import stop as _stop

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DASHBOARD = ROOT / "docs" / "grafana" / "orch-fleet.json"
XID_GPU = 5
"""The GPU (container numbering, which is the host's here) the injected Xid names."""
GRAFANA_VARS = {"$__rate_interval": "30s", "$__range": "1h", "$Hostname": ".*", "$container": ".*"}
"""What Grafana puts in for its variables: "All" with allValue ``.*``; a rate interval that
holds several 1 s scrapes."""


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read().decode())
        except OSError:
            return []
        assert doc.get("status") == "success", (expr, doc)
        return doc["data"]["result"]


@pytest.fixture
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Prom]]:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus not installed (apt: prometheus)")
    from orchestrator.sandbox import kernel, manager

    state_dir = tmp_path_factory.mktemp("grafana-sandbox")
    info = manager.up(
        state_dir, containers=2, gpus=8, scenario="ghost", isolation=SANDBOX_ISOLATION
    )
    fleet = Fleet(info, state_dir)
    procs: list[subprocess.Popen] = []
    try:
        fleet.launch("ct200")
        bus = _scenario_bus(fleet, XID_GPU)
        kernel.append_kernel_line(
            state_dir,
            f"NVRM: Xid (PCI:0000:{bus}:00): 48, pid='<unknown>', name=<unknown>, "
            "An uncorrectable double bit error (DBE) has been detected on GPU.",
            level=3,
        )  # the format of open-gpu-kernel-modules' nvErrorLog (kernel-open/nvidia, 570.x)
        export_port, prom_port = free_port(), free_port()
        procs.append(
            subprocess.Popen(
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
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
        )
        root = tmp_path_factory.mktemp("prometheus")
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: orch\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{export_port}']}}]\n"
        )
        procs.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        prom = Prom(prom_port)
        wait_for(
            lambda: len(prom.query("DCGM_FI_DEV_GPU_UTIL")) == 16,
            120,
            0.5,
            "16 GPU series in Prometheus",
        )
        yield fleet, prom
    finally:
        for p in reversed(procs):
            _stop(p)
        manager.down(state_dir)


def _scenario_bus(fleet: Fleet, index: int) -> str:
    """The PCI bus byte (lower-case hex, as the kernel prints it) of the scenario's GPU ``index``."""
    from orchestrator.sandbox.scenario import read_scenario

    dev = read_scenario(fleet.state_dir)["devices"][index]
    return dev["pci_bus_id"].split(":")[1].lower()


def _default_counters(fleet: Fleet, prom: Prom) -> None:
    from orchestrator.sandbox.scenario import read_scenario

    devices = read_scenario(fleet.state_dir)["devices"]
    want = {(c, str(g)) for c in ("ct200", "ct201") for g in range(8)}

    def all_there() -> dict[str, list[dict]]:
        got = {name: prom.query(name) for name in FROM_NVML}
        missing = [n for n, series in got.items() if len(series) != 16]
        return {} if missing else got  # NVLink needs a second host reading: poll

    got = wait_for(all_there, 90, 0.5, "every NVML default counter on 16 GPUs")
    for name, series in got.items():
        labels = [r["metric"] for r in series]
        assert {(m["container"], m["gpu"]) for m in labels} == want, name
        for m in labels:
            assert set(m) == GPU_LABELS | {"__name__", "job", "instance"}, (name, m)
            dev = devices[int(m["gpu"])]
            assert (m["UUID"], m["pci_bus_id"]) == (dev["uuid"], dev["pci_bus_id"]), (name, m)
            assert (m["device"], m["modelName"]) == (f"nvidia{m['gpu']}", dev["name"]), (name, m)
            assert (m["Hostname"], m["DCGM_FI_DRIVER_VERSION"]) == ("sandbox", "570.172.08")
    value = {
        name: {(r["metric"]["container"], r["metric"]["gpu"]): float(r["value"][1]) for r in series}
        for name, series in got.items()
    }
    assert set(value["DCGM_FI_DEV_SM_CLOCK"].values()) == {1980.0}  # fakenvml.c's default
    assert value["DCGM_FI_DEV_GPU_UTIL"][("ct200", "3")] == 100.0  # the ghost
    assert {k for k, v in value["DCGM_FI_DEV_XID_ERRORS"].items() if v} == {
        ("ct200", str(XID_GPU)),
        ("ct201", str(XID_GPU)),
    }
    assert value["DCGM_FI_DEV_XID_ERRORS"][("ct200", str(XID_GPU))] == 48.0
    assert min(value["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].values()) > 0


def _dashboard_queries(prom: Prom) -> None:
    targets = [
        (p["title"], t) for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]
    ]
    assert len(targets) >= 15

    def expr(t: dict) -> str:
        text = t["expr"]
        for var, value in GRAFANA_VARS.items():
            text = text.replace(var, value)
        assert "$" not in text, f"a Grafana variable the test does not know: {text}"
        return text

    def answered() -> dict[str, list[dict]]:
        got = {f"{title}: {t['refId']}": prom.query(expr(t)) for title, t in targets}
        return got if all(got.values()) else {}

    got = wait_for(answered, 90, 1.0, "every dashboard query answered")
    for title, t in targets:
        wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
        for r in got[f"{title}: {t['refId']}"]:
            # a host's own finding has no container; everything else names each label
            present = {k for k, v in r["metric"].items() if v or k == "container"}
            assert wanted <= present, (title, t["expr"], r["metric"])


def _lacking_field_leaves(fleet: Fleet, prom: Prom) -> None:
    """GPU 3 stops giving its memory temperature and remapped rows (NOT_SUPPORTED, as a board
    without them answers): those series go stale in Prometheus; its clock stays."""
    from orchestrator.sandbox.scenario import load_scenario, set_scenario

    _name, doc = load_scenario("ghost")
    doc["devices"][3]["not_supported"] = ["NVML_FI_DEV_MEMORY_TEMP", "nvmlDeviceGetRemappedRows"]
    set_scenario(fleet.state_dir, {**doc, "name": "ghost-lacking"})
    lacking = "DCGM_FI_DEV_MEMORY_TEMP{gpu='3'} or DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu='3'}"
    wait_for(lambda: not prom.query(lacking), 60, 0.5, "GPU 3's lacking fields gone")
    assert len(prom.query("DCGM_FI_DEV_SM_CLOCK{gpu='3'}")) == 2
    assert len(prom.query("DCGM_FI_DEV_MEMORY_TEMP")) == 14


def test_prometheus_over_a_sandbox_holds_dcgms_defaults_and_answers_the_dashboard(scraped) -> None:
    """One test, one sandbox: the three checks share its exporter and Prometheus (split, a
    parallel run would start a sandbox per worker). The last one changes the scenario."""
    fleet, prom = scraped
    _default_counters(fleet, prom)
    _dashboard_queries(prom)
    _lacking_field_leaves(fleet, prom)
