"""watch, check and export judge a target through the one monitor: fed the same recorded
history, they show the same findings and the same state.

Each recorded history is a detector case (``tests/detect/<kind>/<case>.json``) that needs
no host probe and no clock of its own: the three views take time from the snapshots.
``watch`` gets the snapshots one by one through its model, ``check`` finds all but the
newest in its SQLite history and gets the newest as its one-shot snapshot, ``export``
polls them one by one; then each view's own output is compared as well.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from orchestrator.config.inventory import LOCAL, ContainerConfig, Inventory
from orchestrator.config.limits import Limits
from orchestrator.monitor import sweep
from orchestrator.monitor.history import History
from orchestrator.monitor.poller import Poller
from orchestrator.views import check, export, watch, watch_model
from orchestrator.wire.model import Snapshot

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
