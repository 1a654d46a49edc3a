"""Fixtures for the agent tests run on this machine: real tmux, real pynvml on the fake library.

``agent_env`` gives a temp workdir, its own tmux server (``TMUX_TMPDIR``), the fake
libnvidia-ml on ``LD_LIBRARY_PATH``, a scenario file that can be switched
atomically, the sandbox's nvidia-smi stand-in first on ``PATH`` and a GPU
deadline loose enough for a loaded machine (``ORCH_AGENT_GPU_DEADLINE_S``). Every agent
process a test starts inherits these through the environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.agent.__main__ import GPU_DEADLINE_ENV
from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.sandbox.fakenvml import SCENARIO_ENV, build_fake_nvml

SANDBOX = Path(__file__).resolve().parents[2] / "orchestrator" / "sandbox"
SCENARIOS = SANDBOX / "scenarios"


@dataclass
class AgentEnv:
    workdir: Path
    scenario_file: Path
    tmux_tmpdir: Path

    def set_scenario(self, name: str, **changes: object) -> dict:
        """Switch the fake NVML scenario (temp + rename, as the library re-reads it per call)."""
        data = json.loads((SCENARIOS / f"{name}.json").read_text())
        data.update(changes)
        tmp = self.scenario_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.scenario_file)
        return data

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", *args],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "TMUX_TMPDIR": str(self.tmux_tmpdir)},
        )

    def inventory(self, **container: object) -> Inventory:
        c = ContainerConfig(name="local", host="local", workdir=str(self.workdir), **container)  # type: ignore[arg-type]
        return Inventory(path=None, hosts={}, containers={"local": c})

    def new_run(self, run_id: str, log: bytes = b"") -> Path:
        run = self.workdir / "runs" / run_id
        run.mkdir(parents=True, exist_ok=True)
        (run / "train.log").write_bytes(log)
        (self.workdir / "runs" / "current").write_text(run_id + "\n")
        return run


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml")).parent


@pytest.fixture
def agent_env(
    tmp_path: Path, fake_nvml_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AgentEnv]:
    tmux_dir = Path(
        f"/tmp/orch-at-{os.getpid()}-{tmp_path.name}"
    )  # short: tmux socket paths are limited
    tmux_dir.mkdir(parents=True, exist_ok=True)
    env = AgentEnv(
        workdir=tmp_path / "work", scenario_file=tmp_path / "scenario.json", tmux_tmpdir=tmux_dir
    )
    env.workdir.mkdir()
    env.set_scenario("healthy")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_nvml_dir))
    monkeypatch.setenv(SCENARIO_ENV, str(env.scenario_file))
    monkeypatch.setenv("TMUX_TMPDIR", str(tmux_dir))
    monkeypatch.setenv("PATH", f"{SANDBOX / 'bin'}:{os.environ['PATH']}")
    # Production's 2 s GPU deadline trips when a loaded CI machine starts the nvidia-smi
    # stand-in (a Python script) slowly; tests that time a hang set their own deadline.
    monkeypatch.setenv(GPU_DEADLINE_ENV, "15")
    yield env
    env.tmux("kill-server")
    shutil.rmtree(tmux_dir, ignore_errors=True)
