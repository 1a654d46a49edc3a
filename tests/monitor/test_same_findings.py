"""watch, check and export judge a target through the one monitor: fed the same recorded
history, they show the same findings and the same state, on the in-container path and on the
host path (each snapshot as the host observer's document, through the observer's host round
and host stream).

Each recorded history is a detector case (``tests/detect/<kind>/<case>.json``) that needs
no host probe and no clock of its own: the three views take time from the snapshots.
``watch`` gets the snapshots one by one through its model, ``check`` finds all but the
newest in its SQLite history and gets the newest as its one-shot snapshot, ``export``
polls them one by one; then each view's own output is compared as well.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.inventory import LOCAL, ContainerConfig, HostConfig, Inventory
from orchestrator.config.limits import Limits
from orchestrator.monitor import sweep
from orchestrator.monitor.history import History
from orchestrator.monitor.hostpath import fan_out
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.observer import Observer
from orchestrator.monitor.poller import Poller
from orchestrator.views import check, export, watch, watch_model
from orchestrator.wire.model import HostDocument, Snapshot

CASES_DIR = Path(__file__).resolve().parents[1] / "detect"
CASES = [
    p
    for p in sorted(CASES_DIR.glob("*/*.json"))
    if not (case := json.loads(p.read_text())).get("probes") and case.get("now") is None
]


def _setup(path: Path) -> tuple[Inventory, str, list[Snapshot]]:
    case = json.loads(path.read_text())
    snaps = [Snapshot.from_dict(s) for s in case["snapshots"]]
    name = snaps[-1].target
    roles = {int(k): v for k, v in case.get("roles", {}).items()}
    by_role: dict[str, tuple[int, ...]] = {}
    for gpu, role in sorted(roles.items()):
        by_role[role] = (*by_role.get(role, ()), gpu)
    cfg = ContainerConfig(
        name=name, host=LOCAL, gpus=by_role, limits=Limits().merged(case.get("limits", {}))
    )
    return Inventory(path=None, hosts={}, containers={name: cfg}), name, snaps


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_watch_check_and_export_agree(path: Path, tmp_path: Path) -> None:
    inventory, name, snaps = _setup(path)
    cfg = inventory.container(name)

    # watch: the model, one streamed snapshot at a time
    model = watch_model.WatchModel([watch_model.TargetView(name, cfg.roles_by_gpu, cfg)])
    for s in snaps:
        model.apply(name, s)
    seen = model.views[name]

    # check: the stored history, then the newest snapshot as this check's one-shot answer
    db = tmp_path / "orch.db"
    with History.open(db, inventory=inventory) as history:
        history.record(snaps[:-1])
    opts = sweep.CheckOptions(names=[name], db_path=db, probe_hosts=False)
    report = sweep.run_check(inventory, opts, fetch=lambda n, resume: snaps[-1])
    (checked,) = report.targets

    # export: one poll per snapshot
    feed = iter(snaps)
    poller = Poller(inventory, [name], fetch=lambda n: next(feed))
    for _ in snaps:
        poller.poll_once()
    (polled,) = poller.latest()

    assert seen.findings == checked.findings == polled.findings, path.name
    assert seen.state == checked.state == polled.state
    want = [e["kind"] for e in json.loads(path.read_text())["expect"]]
    got = [f.kind for f in checked.findings]
    assert [k for k in got if k in want] == want and set(got) - set(want) <= {"unreachable"}, got

    # ... and each view says so in its own words
    kinds = {f.kind for f in checked.findings}
    flagged = {f.kind for f in checked.findings if f.severity >= 1}
    lines = "\n".join(check.lines(report))
    assert all(f" {k}" in lines for k in flagged), lines
    plain = watch.plain_line(seen, now=0.0)
    assert all(f":{k}" in plain for k in kinds - watch.HIDDEN_KINDS), plain
    metrics = {
        s.labels["kind"]
        for fam in export.families(poller.latest())
        if fam.name == "orch_finding"
        for s in fam.samples
    }
    assert metrics == kinds


def test_the_cases_cover_every_view_kind() -> None:
    """The recorded histories used above reach the kinds a dashboard most often shows."""
    kinds = {p.parent.name for p in CASES}
    assert {"ghost-utilization", "crashed", "silent-death", "unreachable", "stall"} <= kinds
    assert len(CASES) >= 20, [p.name for p in itertools.islice(CASES, 5)]


# --- the host path: the same histories as one Proxmox host's documents -------------------------

HOST = "pve1"
VMID = 200
PANE_ONLY = {"enospc_on_an_earlier_pane_screen"}
"""Cases whose finding is on the pane alone: the host path reads the pane only for a live run
without its log (``needs_pane``), so it does not see them (by design: a ``pct exec`` less)."""
HOST_CASES = [
    p
    for p in CASES
    if p.stem not in PANE_ONLY
    and all(
        s.get("reachable", True) and s.get("container_status") in (None, "running")
        for s in json.loads(p.read_text())["snapshots"]
    )
]


def _host_setup(path: Path) -> tuple[Inventory, str, list[Snapshot], list[HostDocument]]:
    """The case's container on a host observed from the host, and each snapshot as the host
    observer's document of it (the GPUs the host's, the events the container's by vmid)."""
    inventory, name, snaps = _setup(path)
    cfg = replace(inventory.container(name), host=HOST, vmid=VMID)
    hosts = {HOST: HostConfig(name=HOST, address="127.0.0.1")}
    inventory = Inventory(path=None, hosts=hosts, containers={name: cfg})
    docs = []
    for s in snaps:
        gpus = tuple(
            replace(g, index=g.index if g.host_index is None else g.host_index) for g in s.gpus
        )
        session = s.session and replace(s.session, pane_tail=())  # the host reads no pane
        inner = replace(s, gpus=(), nvml=None, kernel_events=(), source="host", session=session)
        events = tuple(replace(e, vmid=VMID if e.vmid is None else e.vmid) for e in s.kernel_events)
        docs.append(
            HostDocument(
                HOST,
                s.taken_at,
                gpus=gpus,
                nvml=s.nvml,
                containers={name: inner},
                visible_gpus={name: tuple(g.index for g in gpus)},
                kernel_events=events,
            )
        )
    return inventory, name, snaps, docs


class RecordedHost:
    """Stands in for :class:`~orchestrator.remote.hostlink.HostLink`: the recorded documents in
    order, one per ``observe``, or all over one stream that then stays open until ``stop``."""

    def __init__(self, names: list[str], docs: list[HostDocument], stop: threading.Event) -> None:
        self.names, self.docs, self.stop = names, docs, stop
        self.served = 0
        """Documents served; ``at``: the index of the newest one in the whole history."""
        self.at = -1
        self.cursor: str | None = None
        self.since: float | None = None
        self.resume: dict[str, tuple[str, int]] = {}

    def observe(self, timeout: float = 30.0) -> HostDocument:
        self.served += 1
        self.at += 1
        return self.docs[self.served - 1]

    def stream_once(self, interval_s: float) -> Iterator[HostDocument]:
        while self.served < len(self.docs):
            yield self.observe()
        self.stop.wait(30)


@pytest.mark.parametrize("path", HOST_CASES, ids=[f"{p.parent.name}/{p.stem}" for p in HOST_CASES])
def test_watch_check_and_export_agree_on_the_host_path(path: Path, tmp_path: Path) -> None:
    inventory, name, snaps, docs = _host_setup(path)
    cfg = inventory.container(name)
    stop = threading.Event()
    links: list[RecordedHost] = []

    def link(docs: list[HostDocument]) -> Any:
        def make(host: str, names: list[str]) -> RecordedHost:
            links.append(RecordedHost(names, docs, stop))
            links[-1].at = len(snaps) - len(docs) - 1
            return links[-1]

        return make

    def pane(n: str, _resume: object = None) -> Snapshot:  # what `pct exec` would have shown
        return snaps[max(0, links[-1].at)]

    # watch: the observer's host stream, judged, into the model
    items: queue.Queue[tuple[str, Any]] = queue.Queue()
    Observer(inventory, [name], fetch=pane, host_link=link(docs)).start(items, stop)
    model = watch_model.WatchModel([watch_model.TargetView(name, cfg.roles_by_gpu, cfg)])
    judged = 0
    try:
        while judged < len(docs):
            key, item = items.get(timeout=30)
            if isinstance(item, Judgement):
                judged += 1
                model.apply(key, item.snapshot, judged=item)
    finally:
        stop.set()
    seen = model.views[name]

    # check: what earlier checks stored, then this check's one host document
    db = tmp_path / "orch.db"
    with History.open(db, inventory=inventory) as history:
        history.record([fan_out(d, inventory, [name])[0][name] for d in docs[:-1]])
    opts = sweep.CheckOptions(names=[name], db_path=db, probe_hosts=False)
    report = sweep.run_check(inventory, opts, fetch=pane, host_link=link(docs[-1:]))
    (checked,) = report.targets

    # export: one poll per document
    poller = Poller(inventory, [name], fetch=pane, host_link=link(docs))
    for _ in docs:
        poller.poll_once()
    (polled,) = poller.latest()

    assert checked.snapshot.source == polled.snapshot.source == seen.current.source == "host"
    assert seen.findings == checked.findings == polled.findings, path.name
    assert seen.state == checked.state == polled.state
    want = [e["kind"] for e in json.loads(path.read_text())["expect"]]
    got = [f.kind for f in checked.findings]
    assert [k for k in got if k in want] == want and set(got) - set(want) <= {"unreachable"}, got


def test_the_host_cases_cover_the_main_kinds() -> None:
    kinds = {p.parent.name for p in HOST_CASES}
    assert {"ghost-utilization", "crashed", "silent-death", "stall"} <= kinds, kinds
