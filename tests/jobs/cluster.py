"""A small cluster for the job tests: a sandbox of 4 LXC containers on 2 simulated Proxmox hosts
(ct200, ct201 on ``sandbox``; ct202, ct203 on ``sandbox2``) on one job network, and the
faults a multi-node job meets (a rank's trainer killed, a node's container stopped, a host's
job-network link down). Used by tests/jobs and tests/reliability/test_job_faults.py through
the session fixture ``job_cluster`` (tests/conftest.py).

Jobs run the bundled trainer with ``instant-cpu`` slowed to a step every ~30 ms (``slow@1``):
the tests must not depend on how fast the machine trains, and four busy-looping ranks would
starve a 2-core box of the CPU the monitor needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TRAINER_ARGS = ("--", "--forever", "--set", "train.batch_size=8", "--fault", "slow@1:30")
"""Every node: 8 sequences a step (4 nodes x 2 drafter replicas), a step every ~30 ms."""
POLL_S = 2.0
"""The containers' poll_interval in the test hosts.yaml (orch check's "two poll intervals")."""


@dataclass
class Cluster:
    info: Any
    state_dir: Path
    workdir: Path
    _n: int = 0
    cleanups: list[Any] = field(default_factory=list)

    def config(self, jobs: dict[str, dict[str, Any]], **containers: dict[str, Any]) -> Path:
        """A hosts.yaml of the sandbox with ``jobs`` (and container overrides): fast polls,
        a generous startup timeout (four torchruns start on two shared cores)."""
        doc = yaml.safe_load(Path(self.info.config_path).read_text())
        doc["defaults"]["poll_interval"] = POLL_S
        doc["defaults"]["thresholds"] = {"startup_timeout_s": 240, "startup_grace_s": 240}
        for h in doc["hosts"].values():
            h.update({"keepalive_s": 2, "connect_timeout_s": 5})
        for name, over in containers.items():
            doc["containers"][name].update(over)
        doc["jobs"] = jobs
        self._n += 1
        path = self.workdir / f"hosts-{self._n}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    def orch(
        self, config: Path, *args: str, timeout_s: float = 400.0
    ) -> subprocess.CompletedProcess[str]:
        """``orch -c CONFIG ARGS`` as a real process, with a private history database."""
        env = {
            **os.environ,
            "ORCH_DB": str(config.with_suffix(".db")),
            "XDG_STATE_HOME": str(self.workdir / "state"),
        }
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-c", str(config), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            env=env,
        )

    def launch(self, config: Path, job: str, *extra: str) -> dict[str, Any]:
        res = self.orch(config, "launch", job, "--json", *(extra or TRAINER_ARGS))
        assert res.stdout.strip(), res.stderr[-3000:]
        doc = json.loads(res.stdout)
        assert res.returncode == 0 and doc.get("verified"), res.stdout[-3000:] + res.stderr[-2000:]
        self.cleanups.append(lambda: self.orch(config, "stop", job, "--grace", "4", timeout_s=120))
        return doc

    def check(self, config: Path, *names: str) -> tuple[int, dict[str, Any], float]:
        """``orch check --json NAMES``: exit code, document, seconds it took."""
        t0 = time.monotonic()
        res = self.orch(config, "check", "--json", "--timeout", "30", *names, timeout_s=120)
        assert "Traceback" not in res.stderr, res.stderr
        return res.returncode, json.loads(res.stdout), time.monotonic() - t0

    def log(self, container: str, run_id: str) -> str:
        path = self.info.workdir(container) / "runs" / run_id / "train.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def trainer_pids(self, container: str) -> list[int]:
        """Host PIDs of the container's trainer workers (``python -u -m trainer``, not the
        torchrun agent, not the wrapper's shell)."""
        found = []
        for pid in self.info.container_pids(container):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if (
                "trainer" in argv
                and "-m" in argv
                and not any("torch.distributed.run" in a for a in argv)
            ):
                found.append(pid)
        return found

    def kill_trainer(self, container: str) -> int:
        pids = self.trainer_pids(container)
        assert pids, f"no trainer running in {container}"
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    def stop_container(self, container: str) -> None:
        from orchestrator.sandbox import manager

        manager.stop_container(self.state_dir, container)
        self.cleanups.append(lambda: self.start_container(container))

    def start_container(self, container: str) -> None:
        from orchestrator.sandbox import manager

        with contextlib.suppress(manager.SandboxError):
            manager.start_container(self.state_dir, container)

    def partition(self, host: str) -> None:
        from orchestrator.sandbox import network
        from orchestrator.sandbox.state import read_state

        network.partition(self.state_dir, read_state(self.state_dir), host)
        self.cleanups.append(lambda: network.heal(self.state_dir, read_state(self.state_dir), host))

    def cleanup(self) -> None:
        while self.cleanups:
            fn = self.cleanups.pop()
            with contextlib.suppress(Exception):
                fn()


def start(state_dir: Path, workdir: Path) -> Cluster:
    """The cluster's sandbox (LXC only; the caller skips otherwise), GPUs idle."""
    from orchestrator.sandbox import manager

    info = manager.up(
        state_dir, containers=4, gpus=2, scenario="idle", isolation="lxc", host_count=2
    )
    workdir.mkdir(parents=True, exist_ok=True)
    return Cluster(info, state_dir, workdir)


def wait_for_death(cluster: Cluster, config: Path, job: str, deadline_s: float) -> dict[str, Any]:
    """Poll ``orch check JOB`` until every node of the job has failed (its worker died, even
    while torchrun's agent lingers) or stopped running; the last document."""
    end = time.monotonic() + deadline_s
    while True:
        _rc, doc, _s = cluster.check(config, job)
        t = doc["targets"][0]
        if all(
            n["failure"] or n["state"] not in ("running", "starting", "stalled") for n in t["nodes"]
        ):
            return doc
        assert time.monotonic() < end, json.dumps(t, indent=1)[:3000]
        time.sleep(1.0)
