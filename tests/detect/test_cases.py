"""Table-driven detector tests: every ``tests/detect/<kind>/<case>.json`` is one case.

A case holds the snapshots in (``Snapshot.to_dict()`` form, oldest first), optional
host ``probes``, ``roles``, ``limits`` overrides, ``now`` and ``all_xids``, and the
findings expected, worst first. Each expected finding lists ``kind`` and any of
``severity``, ``gpus``, ``playbook``, ``summary_contains``. The produced kinds must be
exactly the expected ones, in order: a detector that over-fires fails its case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.limits import Limits
from orchestrator.detect.engine import KIND_ORDER, run_detectors
from orchestrator.wire.model import HostProbe, Snapshot

HERE = Path(__file__).parent
CASES = sorted(HERE.glob("*/*.json"))


def _run(case: dict) -> list:
    return run_detectors(
        [Snapshot.from_dict(s) for s in case["snapshots"]],
        limits=Limits().merged(case.get("limits", {})),
        roles={int(k): v for k, v in case.get("roles", {}).items()} or None,
        probes=[HostProbe.from_dict(p) for p in case.get("probes", [])],
        now=case.get("now"),
        all_xids=case.get("all_xids", False),
    )


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_case(path: Path) -> None:
    case = json.loads(path.read_text())
    found = _run(case)
    got = [f.kind for f in found]
    want = [e["kind"] for e in case["expect"]]
    assert got == want, f"{path.name}: {case['description']}\n" + "\n".join(
        f"  {f.kind} {f.severity} {f.gpus} {f.playbook}: {f.summary}" for f in found
    )
    for f, e in zip(found, case["expect"], strict=True):
        if "severity" in e:
            assert str(f.severity) == e["severity"], f.summary
        if "gpus" in e:
            assert list(f.gpus) == e["gpus"], f.summary
        if "playbook" in e:
            assert f.playbook == e["playbook"], f.summary
        if "summary_contains" in e:
            assert e["summary_contains"] in f.summary
        assert f.since is not None or f.kind in ("xid", "oom-killer"), f"{f.kind} has no since"
        assert f.evidence, f"{f.kind} carries no evidence"


def test_every_kind_has_a_case() -> None:
    folders = {p.parent.name for p in CASES}
    missing = set(KIND_ORDER) - folders
    assert not missing, f"no test case for: {sorted(missing)}"


def test_seed_000_reading_fires_ghost_on_gpu_3_only() -> None:
    case = json.loads((HERE / "silent-death" / "seed000_no_tmux_no_log.json").read_text())
    ghosts = [f for f in _run(case) if f.kind == "ghost-utilization"]
    assert [f.gpus for f in ghosts] == [(3,)]
    assert "0 MiB, 100 %" in ghosts[0].evidence[0]


def test_seed_002_same_reading_flips_at_the_grace() -> None:
    """The 8 s reading is quiet; the identical reading one second past the grace fires."""
    case = json.loads((HERE / "not-allocating" / "seed002_8s_after_launch.json").read_text())
    snap = Snapshot.from_dict(case["snapshots"][0])
    limits = Limits()
    started = snap.run.manifest.started_at  # type: ignore[union-attr]
    before = Snapshot.from_dict(
        {**snap.to_dict(), "taken_at": started + limits.startup_grace_s - 1}
    )
    after = Snapshot.from_dict({**snap.to_dict(), "taken_at": started + limits.startup_grace_s + 1})
    assert [f.kind for f in run_detectors([before], limits=limits)] == []
    assert [f.kind for f in run_detectors([after], limits=limits)] == ["not-allocating"]


def test_unreachable_never_reported_as_death() -> None:
    case = json.loads((HERE / "silent-death" / "seed000_no_tmux_no_log.json").read_text())
    snaps = [Snapshot.from_dict(s) for s in case["snapshots"]]
    down = Snapshot.unreachable("lxc200", snaps[-1].taken_at + 5, "pve1: unreachable: timed out")
    only_down = run_detectors([down, down], limits=Limits())
    assert [f.kind for f in only_down] == ["unreachable"]
    assert only_down[0].summary.endswith("unknown, not dead")  # a passing outage: no reason


def test_a_refused_host_key_is_in_the_unreachable_summary() -> None:
    revoked = (
        "sb (127.0.0.1:22): HOST KEY REVOKED (SHA256:k is marked @revoked on line 2 of "
        "/k). Refusing to connect: the host must get a new key; then run: orch trust sb"
    )
    down = Snapshot.unreachable("ct200", 1.0e9, revoked)
    (found,) = run_detectors([down], limits=Limits())
    assert found.kind == "unreachable" and found.summary.endswith(f"not dead: {revoked}")


def test_order_is_worst_first() -> None:
    for path in CASES:
        found = _run(json.loads(path.read_text()))
        sev = [int(f.severity) for f in found]
        assert sev == sorted(sev, reverse=True), path.name


def test_now_extends_quiet_time_for_stall() -> None:
    case = json.loads((HERE / "healthy" / "steady_run.json").read_text())
    snaps = [Snapshot.from_dict(s) for s in case["snapshots"]]
    later = snaps[-1].taken_at + Limits().stall_timeout_s + 1
    assert "stall" in [f.kind for f in run_detectors(snaps, limits=Limits(), now=later)]
    assert run_detectors(snaps, limits=Limits()) == []
