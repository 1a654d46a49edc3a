"""``orch export``: Prometheus metrics from the latest snapshots.

GPU readings use dcgm-exporter's metric names and labels (``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``; here ``Hostname`` is the Proxmox host and
``container`` the orch target), so Grafana dashboards built for dcgm-exporter
work unchanged. Run and health state are ``orch_*`` gauges.

The monitor's :class:`~orchestrator.monitor.poller.Poller` takes a concurrent one-shot
snapshot of every target each ``interval_s`` and judges it over an in-memory history; a
custom Collector turns the newest judgements into metric families at scrape time, so a
scrape never waits on SSH. ``--textfile`` writes the node_exporter textfile
format atomically (temp file + rename, by prometheus-client).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.monitor.jobs import JobJudgement
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.poller import Poller
from orchestrator.monitor.state import stopped_on_request
from orchestrator.wire.model import GpuSample, KernelEvent

log = logging.getLogger(__name__)

# dcgm-exporter's labels (internal/pkg/rendermetrics/render_metrics.go, gpuMetricsFormat:
# gpu, UUID, pci_bus_id, device, modelName, then the "label" fields of its counters CSV, of
# which etc/default-counters.csv has DCGM_FI_DRIVER_VERSION), and its container label.
DCGM_LABELS = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "container",
    "DCGM_FI_DRIVER_VERSION",
]
# orch's own series carry dcgm's Hostname and container besides target and host, so that
# `on (Hostname, container)` joins them to the GPU series without label_replace.
TARGET_LABELS = ["target", "host", "Hostname", "container"]
DCGM_MORE = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temp_c"),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replay_count"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_copy_util_pct"),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "encoder_util_pct"),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "decoder_util_pct"),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "memory_reserved_mib"),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes.",
        "nvlink_bandwidth_mib_s",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        "remapped_rows_uncorrectable",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        "remapped_rows_correctable",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "row_remap_failure"),
)
"""The rest of dcgm-exporter's default counters NVML gives (etc/default-counters.csv, tag
4.5.3-4.8.2): name, its help text there, the GpuSample field. A reading the GPU lacks is no
series, never 0. dcgm-exporter types the energy, replay, NVLink and remapped-rows fields
``counter``; they are gauges here (prometheus_client would rename a counter ``*_total``), so
the stored series, names and labels are dcgm's, only the metadata type differs."""
XID_KINDS = {"xid": None, "fallen-off-bus": 79}
"""Kernel events that set DCGM_FI_DEV_XID_ERRORS (a bare "fallen off the bus" line is Xid 79)."""


def families(observed: Sequence[Judgement], hosts: Sequence[Judgement] = ()) -> list[Metric]:
    """Metric families for ``observed`` (pure: the collector and the tests call it), and the
    hosts' own findings as ``orch_finding{target="host:<name>"}``.

    GPUs of an unreachable target are left out (no data is not zero);
    ``orch_target_reachable`` says why.

    >>> from orchestrator.wire.model import GpuSample, Snapshot
    >>> s = Snapshot("ct200", 1.0, gpus=(GpuSample(3, "GPU-3", "H200", 100.0, 0.0, 143771.0),))
    >>> fams = {f.name: f for f in families([Judgement("ct200", s, "idle", host="pve1")])}
    >>> [(x.labels["gpu"], x.value) for x in fams["DCGM_FI_DEV_FB_FREE"].samples]
    [('3', 143771.0)]
    """
    util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=DCGM_LABELS)
    fb_used = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=DCGM_LABELS
    )
    fb_free = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=DCGM_LABELS
    )
    temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=DCGM_LABELS)
    power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=DCGM_LABELS)
    xid = GaugeMetricFamily(
        "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=DCGM_LABELS
    )
    more = [(GaugeMetricFamily(n, h, labels=DCGM_LABELS), attr) for n, h, attr in DCGM_MORE]
    reachable = GaugeMetricFamily(
        "orch_target_reachable",
        "1 when the target's last snapshot came back.",
        labels=TARGET_LABELS,
    )
    state = GaugeMetricFamily(
        "orch_target_state",
        "1 for the target's current state word.",
        labels=[*TARGET_LABELS, "state"],
    )
    taken = GaugeMetricFamily(
        "orch_snapshot_timestamp_seconds",
        "Unix time of the target's newest snapshot.",
        labels=TARGET_LABELS,
    )
    run_up = GaugeMetricFamily(
        "orch_run_up",
        "1 while the newest run is alive (starting, running, stalled).",
        labels=TARGET_LABELS,
    )
    run_info = GaugeMetricFamily(
        "orch_run_info", "The newest run's id (always 1).", labels=[*TARGET_LABELS, "run_id"]
    )
    step = GaugeMetricFamily(
        "orch_run_step", "Last training step seen in the log.", labels=TARGET_LABELS
    )
    tps = GaugeMetricFamily(
        "orch_run_tokens_per_second", "Last tokens/s seen in the log.", labels=TARGET_LABELS
    )
    rate = GaugeMetricFamily(
        "orch_run_throughput",
        "Last training throughput seen in the log, in its printed unit (tokens/s, "
        "tokens/s/device, samples/s, words/s, it/s, s/step, TFLOP/s/device).",
        labels=[*TARGET_LABELS, "unit"],
    )
    total_steps = GaugeMetricFamily(
        "orch_run_total_steps", "Total training steps the log prints.", labels=TARGET_LABELS
    )
    exit_status = GaugeMetricFamily(
        "orch_run_exit_status",
        "Exit status of the newest run, once it ended.",
        labels=TARGET_LABELS,
    )
    stop_requested = GaugeMetricFamily(
        "orch_run_stop_requested",
        "1 when the newest run ended because orch stop asked it to (state stopped: no "
        "failure, whatever its exit status), 0 otherwise.",
        labels=TARGET_LABELS,
    )
    finding = GaugeMetricFamily(
        "orch_finding",
        "1 per active finding (kind as in orch check).",
        labels=[*TARGET_LABELS, "kind", "severity", "gpus"],
    )
    host_events: dict[str, list[KernelEvent]] = {}
    for h in hosts:  # Xids no container owns: still the GPU's, as dcgm-exporter reports them
        host_events.setdefault(h.host or "", []).extend(h.snapshot.kernel_events)
    for o in observed:
        tl = [o.name, o.host or "", o.host or "", o.name]
        snap = o.snapshot
        reachable.add_metric(tl, 1.0 if snap.reachable else 0.0)
        state.add_metric([*tl, o.state], 1.0)
        taken.add_metric(tl, snap.taken_at)
        for f in o.findings:
            finding.add_metric([*tl, f.kind, str(f.severity), ",".join(map(str, f.gpus))], 1.0)
        if not snap.reachable:
            continue
        driver = (snap.nvml.driver_version if snap.nvml is not None else None) or ""
        for g in snap.gpus:
            labels = [
                str(g.index),
                g.uuid or "",
                g.pci_bus_id or "",
                f"nvidia{g.index}",
                g.name or "",
                o.host or "",
                o.name,
                driver,
            ]
            _add(util, labels, g.utilization_pct)
            _add(fb_used, labels, g.memory_used_mib)
            if g.memory_total_mib is not None and g.memory_used_mib is not None:
                fb_free.add_metric(labels, max(0.0, g.memory_total_mib - g.memory_used_mib))
            _add(temp, labels, g.temperature_c)
            _add(power, labels, g.power_w)
            for fam, attr in more:
                _add(fam, labels, getattr(g, attr))
            if g.error is None:
                seen = [*host_events.get(o.host or "", ()), *snap.kernel_events]
                xid.add_metric(labels, float(last_xid(g, seen)))
        run = snap.run
        if run is not None:
            run_up.add_metric(tl, 1.0 if o.state in ("starting", "running", "stalled") else 0.0)
            run_info.add_metric([*tl, run.run_id], 1.0)
            if run.exit_status is not None:
                exit_status.add_metric(tl, float(run.exit_status))
            stop_requested.add_metric(tl, 1.0 if stopped_on_request(run, snap.taken_at) else 0.0)
        m = snap.metrics
        if m is not None:
            _add(step, tl, m.step)
            _add(tps, tl, m.tokens_per_s)
            _add(total_steps, tl, m.total_steps)
            if m.throughput is not None and m.throughput_unit is not None:
                _add(rate, [*tl, m.throughput_unit], m.throughput)
    for h in hosts:
        for f in h.findings:
            gpus = ",".join(map(str, f.gpus))
            labels = [h.name, h.host or "", h.host or "", "", f.kind, str(f.severity), gpus]
            finding.add_metric(labels, 1.0)
    return [
        util,
        fb_used,
        fb_free,
        temp,
        power,
        xid,
        *(fam for fam, _ in more),
        reachable,
        state,
        taken,
        run_up,
        run_info,
        step,
        tps,
        rate,
        total_steps,
        exit_status,
        stop_requested,
        finding,
    ]


def last_xid(gpu: GpuSample, events: Sequence[KernelEvent]) -> int:
    """The code of the newest Xid the host's kernel log names for ``gpu`` (by PCI address,
    or by the host's NVML index), ``0`` when none: dcgm-exporter's DCGM_FI_DEV_XID_ERRORS
    ("Value of the last XID error encountered"). ``events`` are the snapshot's, those the
    host observer placed in this container since the run's launch, in log order.

    >>> g = GpuSample(3, pci_bus_id="00000000:5D:00.0", host_index=5)
    >>> last_xid(g, [KernelEvent("xid", "a", xid=13, pci="0000:5d:00"),
    ...              KernelEvent("xid", "b", xid=48, gpu=5), KernelEvent("xid", "c", xid=31, pci="0000:bb:00")])
    48
    >>> last_xid(g, [KernelEvent("fallen-off-bus", "d", pci="0000:5d:00")]), last_xid(g, [])
    (79, 0)
    """
    from orchestrator.agent.host import normalize_pci

    mine = normalize_pci(gpu.pci_bus_id)
    code = 0
    for e in events:
        if e.kind not in XID_KINDS:
            continue
        on = (mine is not None and normalize_pci(e.pci) == mine) or (
            e.gpu is not None and gpu.host_index is not None and e.gpu == gpu.host_index
        )
        value = XID_KINDS[e.kind] or e.xid
        if on and value is not None:
            code = value
    return code


def job_families(jobs: Sequence[JobJudgement]) -> list[Metric]:
    """A job's gauges: its state (its worst node's), its nodes' states and tokens/s, the
    total, and its first failure (pure).

    >>> from orchestrator.monitor.jobs import JobJudgement
    >>> fams = {f.name: f for f in job_families([JobJudgement("pair", "running", (), tokens_per_s=9.0)])}
    >>> [(x.labels["job"], x.value) for x in fams["orch_job_tokens_per_second"].samples]
    [('pair', 9.0)]
    """
    state = GaugeMetricFamily(
        "orch_job_state", "1 for the job's state (its worst node's).", labels=["job", "state"]
    )
    total = GaugeMetricFamily(
        "orch_job_tokens_per_second", "Tokens/s of every node together.", labels=["job"]
    )
    node_state = GaugeMetricFamily(
        "orch_job_node_state",
        "1 for each node's state.",
        labels=["job", "node", "rank", "host", "state"],
    )
    node_tps = GaugeMetricFamily(
        "orch_job_node_tokens_per_second", "Tokens/s of each node.", labels=["job", "node", "rank"]
    )
    failed = GaugeMetricFamily(
        "orch_job_first_failure",
        "1 on the node that failed first (the others' failures follow it).",
        labels=["job", "node", "rank", "role"],
    )
    for jj in jobs:
        state.add_metric([jj.name, jj.state], 1.0)
        _add(total, [jj.name], jj.tokens_per_s)
        for r in jj.nodes:
            rank = str(r.node.rank)
            node_state.add_metric([jj.name, r.node.container, rank, r.host, r.judgement.state], 1.0)
            _add(node_tps, [jj.name, r.node.container, rank], r.tokens_per_s)
        f = jj.first_failure
        if f is not None:
            failed.add_metric([jj.name, f.node, str(f.rank), f.role], 1.0)
    return [state, total, node_state, node_tps, failed]


def _add(fam: GaugeMetricFamily, labels: list[str], value: float | int | None) -> None:
    if value is not None:
        fam.add_metric(labels, float(value))


class FleetCollector(Collector):
    """Builds metric families from a :class:`Poller`'s newest results at scrape time."""

    def __init__(self, source: Poller) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        hosts = getattr(self.source, "hosts", None)  # a source without hosts has none
        yield from families(self.source.latest(), hosts() if hosts else ())
        if getattr(self.source, "jobs", None):  # a source without jobs (tests' fixed ones)
            yield from job_families(self.source.latest_jobs())


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, or ``[::1]:PORT``) -> (host, port).

    >>> parse_listen("127.0.0.1:9400")
    ('127.0.0.1', 9400)
    >>> parse_listen(":9400")
    ('127.0.0.1', 9400)
    >>> parse_listen("[::1]:9400")
    ('::1', 9400)
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def registry_for(poller: Poller) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(poller))
    return registry
