"""``orch export``: Prometheus metrics from the latest snapshots.

GPU readings use dcgm-exporter's metric names and labels (``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``; here ``Hostname`` is the Proxmox host and
``container`` the orch target), so Grafana dashboards built for dcgm-exporter
work unchanged. Run and health state are ``orch_*`` gauges.

A background poller takes a concurrent one-shot snapshot of every target each
``interval_s`` and runs the detectors over an in-memory history; a custom
Collector turns the newest results into metric families at scrape time, so a
scrape never waits on SSH. ``--textfile`` writes the node_exporter textfile
format atomically (temp file + rename, by prometheus-client).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.model import Finding, Snapshot
from orchestrator.monitor.state import target_state

log = logging.getLogger(__name__)

DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "container"]
TARGET_LABELS = ["target", "host"]
_HISTORY = 16  # as check.DETECT_WINDOW: detectors over more cost CPU per poll


@dataclass(frozen=True, slots=True)
class Observed:
    """The newest judgement about one target, as the collector reads it."""

    name: str
    host: str
    snapshot: Snapshot
    findings: tuple[Finding, ...] = ()
    state: str = "connecting"


def families(observed: Sequence[Observed]) -> list[Metric]:
    """Metric families for ``observed`` (pure: the collector and the tests call it).

    GPUs of an unreachable target are left out (no data is not zero);
    ``orch_target_reachable`` says why.

    >>> from orchestrator.model import GpuSample
    >>> s = Snapshot("ct200", 1.0, gpus=(GpuSample(3, "GPU-3", "H200", 100.0, 0.0, 143771.0),))
    >>> fams = {f.name: f for f in families([Observed("ct200", "pve1", s, state="idle")])}
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
    exit_status = GaugeMetricFamily(
        "orch_run_exit_status",
        "Exit status of the newest run, once it ended.",
        labels=TARGET_LABELS,
    )
    finding = GaugeMetricFamily(
        "orch_finding",
        "1 per active finding (kind as in orch check).",
        labels=[*TARGET_LABELS, "kind", "severity", "gpus"],
    )
    for o in observed:
        tl = [o.name, o.host]
        snap = o.snapshot
        reachable.add_metric(tl, 1.0 if snap.reachable else 0.0)
        state.add_metric([*tl, o.state], 1.0)
        taken.add_metric(tl, snap.taken_at)
        for f in o.findings:
            finding.add_metric([*tl, f.kind, str(f.severity), ",".join(map(str, f.gpus))], 1.0)
        if not snap.reachable:
            continue
        for g in snap.gpus:
            labels = [
                str(g.index),
                g.uuid or "",
                f"nvidia{g.index}",
                g.name or "",
                o.host,
                o.name,
            ]
            _add(util, labels, g.utilization_pct)
            _add(fb_used, labels, g.memory_used_mib)
            if g.memory_total_mib is not None and g.memory_used_mib is not None:
                fb_free.add_metric(labels, max(0.0, g.memory_total_mib - g.memory_used_mib))
            _add(temp, labels, g.temperature_c)
            _add(power, labels, g.power_w)
        run = snap.run
        if run is not None:
            run_up.add_metric(tl, 1.0 if o.state in ("starting", "running", "stalled") else 0.0)
            run_info.add_metric([*tl, run.run_id], 1.0)
            if run.exit_status is not None:
                exit_status.add_metric(tl, float(run.exit_status))
        m = snap.metrics
        if m is not None:
            _add(step, tl, m.step)
            _add(tps, tl, m.tokens_per_s)
    return [
        util,
        fb_used,
        fb_free,
        temp,
        power,
        reachable,
        state,
        taken,
        run_up,
        run_info,
        step,
        tps,
        exit_status,
        finding,
    ]


def _add(fam: GaugeMetricFamily, labels: list[str], value: float | int | None) -> None:
    if value is not None:
        fam.add_metric(labels, float(value))


class FleetCollector(Collector):
    """Builds metric families from a :class:`Poller`'s newest results at scrape time."""

    def __init__(self, source: Poller) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(self.source.latest())


class Poller:
    """Keeps the newest snapshot and findings of each target, refreshed by :meth:`poll_once`.

    ``fetch(name) -> Snapshot`` is the one-shot snapshot (``Target(...).snapshot``);
    it is injected so that tests and the benchmark can reuse the poller.
    """

    def __init__(
        self,
        inventory: Any,
        names: Sequence[str],
        *,
        timeout_s: float = 30.0,
        workers: int = 32,
    ) -> None:
        self.inventory = inventory
        self.names = list(names)
        self.timeout_s = timeout_s
        self.workers = workers
        self._lock = threading.Lock()
        self._latest: dict[str, Observed] = {}
        self._history: dict[str, collections.deque[Snapshot]] = {
            n: collections.deque(maxlen=_HISTORY) for n in self.names
        }
        self._targets: dict[str, Any] = {}

    def latest(self) -> list[Observed]:
        with self._lock:
            return [self._latest[n] for n in self.names if n in self._latest]

    def _target(self, name: str) -> Any:
        from orchestrator.target import Target

        t = self._targets.get(name)
        if t is None:
            t = self._targets[name] = Target(self.inventory, name)
        return t

    def poll_once(self) -> None:
        """One concurrent round of snapshots, then the detectors; never raises for a target."""
        from orchestrator.detect.engine import run_detectors
        from orchestrator.monitor.state import roles_by_gpu
        from orchestrator.views.check import _reason, ensure_unreachable_finding, gather

        def job(name: str) -> Callable[[], Snapshot]:
            return lambda: self._target(name).snapshot()

        got = gather(
            {n: job(n) for n in self.names},
            workers=self.workers,
            timeout_s=self.timeout_s,
        )
        now = time.time()
        for n in self.names:
            value = got[n]
            snap = (
                value
                if isinstance(value, Snapshot)
                else Snapshot.unreachable(n, now, _reason(value))
            )
            if not isinstance(value, Snapshot):
                self._targets.pop(n, None)  # reconnect next round
            cfg = self.inventory.container(n)
            hist = self._history[n]
            hist.append(snap)
            try:
                findings = list(
                    run_detectors(
                        list(hist), limits=cfg.limits, roles=roles_by_gpu(cfg.gpus), now=now
                    )
                )
            except Exception:  # noqa: BLE001 - a detector bug must not stop the exporter
                log.exception("%s: detectors failed", n)
                findings = []
            findings = ensure_unreachable_finding(n, snap, findings)
            obs = Observed(
                n,
                cfg.host,
                snap,
                tuple(findings),
                target_state(snap, findings, startup_grace_s=cfg.limits.startup_grace_s),
            )
            with self._lock:
                self._latest[n] = obs

    def close(self) -> None:
        for t in self._targets.values():
            close = getattr(t, "close", None)
            if callable(close):
                close()


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


def serve(
    poller: Poller,
    *,
    listen: str | None,
    textfile: str | None,
    interval_s: float | None,
    stop: threading.Event | None = None,
) -> None:
    """Run the exporter until ``stop`` is set or Ctrl-C.

    ``listen``: serve ``/metrics`` on HOST:PORT (polling every ``interval_s``,
    default 15 s). ``textfile``: write the file after each poll; without
    ``interval_s`` (and without ``listen``) write it once and return, for cron.
    """
    from prometheus_client import start_http_server, write_to_textfile

    stop = stop or threading.Event()
    registry = registry_for(poller)
    server = None
    if listen:
        host, port = parse_listen(listen)
        server, _thread = start_http_server(port, addr=host, registry=registry)
        log.info("serving metrics on http://%s:%d/metrics", host, port)
    once = not listen and interval_s is None
    period = interval_s if interval_s is not None else 15.0
    try:
        while not stop.is_set():
            started = time.monotonic()
            poller.poll_once()
            if textfile:
                write_to_textfile(textfile, registry)
            if once:
                return
            stop.wait(max(0.0, period - (time.monotonic() - started)))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        poller.close()
