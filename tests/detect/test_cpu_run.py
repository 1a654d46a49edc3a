"""A run that says it trains on the CPU (the sandbox's bundled tiny-cpu trainer) is never
``not-allocating``: its GPUs stay at 0 MiB by design."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config.inventory import ContainerConfig
from orchestrator.config.limits import Limits
from orchestrator.detect.engine import run_detectors
from orchestrator.lifecycle.bundle import runs_on_cpu, trainer_config
from orchestrator.wire.model import CPU_RUN_ENV, Snapshot

CASE = Path(__file__).parent / "not-allocating" / "seed002_8s_after_launch.json"


def _after_grace(env: dict[str, str]) -> Snapshot:
    doc = json.loads(CASE.read_text())["snapshots"][0]
    doc["run"]["manifest"]["env"] = env
    snap = Snapshot.from_dict(doc)
    started = snap.run.manifest.started_at  # type: ignore[union-attr]
    return Snapshot.from_dict({**snap.to_dict(), "taken_at": started + 600})


def test_a_cpu_run_past_the_grace_is_not_flagged() -> None:
    kinds = [f.kind for f in run_detectors([_after_grace({CPU_RUN_ENV: "cpu"})], limits=Limits())]
    assert "not-allocating" not in kinds
    # the same reading without the word from the launch still fires
    kinds = [f.kind for f in run_detectors([_after_grace({})], limits=Limits())]
    assert kinds == ["not-allocating"]


def test_the_sandbox_containers_bundled_config_is_a_cpu_one() -> None:
    """The sandbox writes ``trainer_config: tiny-cpu`` (sandbox/hosts.py): launch then sets
    the variable; the 8-GPU config does not."""
    sandbox_ct = ContainerConfig(name="ct200", host="sandbox", trainer_config="tiny-cpu")
    assert runs_on_cpu(trainer_config(sandbox_ct)) is True
    gpu_ct = ContainerConfig(name="ct200", host="pve1", gpus={"target": (0, 1)})
    assert runs_on_cpu(trainer_config(gpu_ct)) is False
