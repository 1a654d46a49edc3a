"""Fixtures for the views tests: a real local webhook receiver."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import SANDBOX_ISOLATION

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Webhook:
    """A real HTTP server on 127.0.0.1 that records every POSTed JSON body.

    ``statuses`` is consumed one per request (then 200), to make it fail on purpose.
    """

    url: str = ""
    bodies: list[dict] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            with hook.lock:
                hook.requests += 1
                status = hook.statuses.pop(0) if hook.statuses else 200
                if status == 200:
                    hook.bodies.append(json.loads(raw))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


# --- an own sandbox for the end-to-end views tests ------------------------------------------
# These tests stop sshd, kill trainers and switch GPU scenarios, so they get a sandbox of
# their own instead of the shared session one (other areas' tests would see the faults).

TRAINER = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500"; sleep 0.5; done'


@dataclass
class Fleet:
    """A running sandbox (two containers, eight GPUs each) and the faults the tests inject."""

    info: object
    state_dir: Path

    @property
    def config(self) -> str:
        return str(self.info.config_path)

    def inventory(self):
        from orchestrator.config.inventory import load_inventory

        return load_inventory(Path(self.config))

    def config_for(self, observe: str, where: Path) -> str:
        """The sandbox's hosts.yaml, or a copy in ``where`` whose host says ``observe: container``
        (the in-container path)."""
        if observe == "host":
            return self.config
        import yaml

        doc = yaml.safe_load(Path(self.config).read_text())
        for h in doc["hosts"].values():
            h["observe"] = observe
        path = where / f"hosts-{observe}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return str(path)

    def orch(
        self, *args: str, timeout_s: float = 120.0, config: str | None = None, **kw
    ) -> subprocess.CompletedProcess:
        """Run ``orch -c <sandbox hosts.yaml> ARGS`` as a real process."""
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-c", config or self.config, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            **kw,
        )

    def scenario(self, name: str) -> None:
        from orchestrator.sandbox import manager

        manager.set_scenario(self.state_dir, name)

    def launch(self, container: str = "ct200") -> str:
        """Start the fake trainer (a loop printing step/loss/tok/s) through the agent; the run id."""
        from orchestrator.remote.target import Target

        inv = self.inventory()
        c = inv.container(container)
        doc = Target(inv, container).agent(
            [
                "launch",
                "--workdir",
                c.workdir,
                "--session",
                c.session,
                "--cmd",
                TRAINER,
                "--no-recorder",
                "--force",
                "--grace",
                "2",
            ],
            timeout=60,
        )
        assert doc.get("ok"), doc
        return doc["run_id"]

    def run_dir(self, container: str = "ct200") -> Path:
        runs = self.info.workdir(container) / "runs"
        return runs / (runs / "current").read_text().strip()

    def kill_trainer(self, container: str = "ct200") -> None:
        """SIGKILL the trainer's process group: the wrapper records exit status 137."""
        pgid = int((self.run_dir(container) / "pgid").read_text().split()[0])
        self.info.kill(container, pgid, group=True)  # a PID from inside the container

    def vanish(self, container: str = "ct200") -> None:
        """SIGKILL the wrapper, the trainer and the tmux server: no exit status, no session (seed 000)."""
        from orchestrator.sandbox import manager

        run = self.run_dir(container)
        self.info.kill(container, int((run / "wrapper.pid").read_text().split()[0]))
        self.info.kill(container, int((run / "pgid").read_text().split()[0]), group=True)
        assert manager.kill_tmux_server(self.state_dir, container)

    def stop_sshd(self) -> None:
        from orchestrator.sandbox import sshd

        assert sshd.stop_sshd(self.state_dir / "sshd")

    def start_sshd(self) -> None:
        from orchestrator.sandbox import manager, sshd

        sshd.start_sshd(
            self.state_dir / "sshd",
            path_prepend=[str(self.state_dir / "bin")],
            env=manager.host_env(self.state_dir),
            port=self.info.port,
        )


@pytest.fixture(scope="package")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    from orchestrator.sandbox import manager

    state_dir = tmp_path_factory.mktemp("views-sandbox")
    info = manager.up(
        state_dir, containers=2, gpus=8, scenario="healthy", isolation=SANDBOX_ISOLATION
    )
    try:
        yield Fleet(info, state_dir)
    finally:
        manager.down(state_dir)
