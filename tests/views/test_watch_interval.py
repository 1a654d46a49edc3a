"""``poll_interval:`` of hosts.yaml reaches ``orch watch`` (seconds between snapshots), and an
explicit ``--interval`` still wins: read off the real agent stream's command line (the
built-in ``local`` target runs it on this machine, as ``ps`` shows it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _stream_argv(workdir: Path) -> list[str] | None:
    """The argv of the ``agent stream`` process observing ``workdir``, when one runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "stream" in argv and str(workdir) in argv:
            return argv
    return None


def _watch_interval(tmp_path: Path, name: str, *extra: str) -> str:
    workdir = tmp_path / name
    config = tmp_path / f"{name}.yaml"
    doc = {"defaults": {"poll_interval": 0.7}, "containers": {"local": {"workdir": str(workdir)}}}
    config.write_text(yaml.safe_dump(doc))
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "-c",
        str(config),
        "watch",
        "--plain",
        *extra,
        "local",
    ]
    env = {**os.environ, "ORCH_DB": str(tmp_path / f"{name}.db")}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        argv = wait_for(lambda: _stream_argv(workdir), 60, 0.1, "the agent stream")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    return argv[argv.index("--interval") + 1]


def test_poll_interval_reaches_watch_and_interval_wins(tmp_path: Path) -> None:
    assert float(_watch_interval(tmp_path, "yaml")) == 0.7
    assert float(_watch_interval(tmp_path, "flag", "--interval", "1.3")) == 1.3
