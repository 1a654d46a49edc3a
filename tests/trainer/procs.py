"""Helpers for the trainer tests: the trainer as a real subprocess, its run-dir files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.yaml"


def trainer_env() -> dict[str, str]:
    """Environment for a trainer subprocess: repo importable, one OpenMP thread, unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def trainer_cmd(run_dir: Path, *extra: str, config: Path = TINY) -> list[str]:
    """argv for ``python -m trainer`` on ``config`` with ``run_dir`` and extra flags."""
    return [
        sys.executable,
        "-m",
        "trainer",
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def run_trainer(
    run_dir: Path, *extra: str, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the trainer to completion (bounded by ``timeout_s``) and capture its output."""
    return subprocess.run(
        trainer_cmd(run_dir, *extra),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def read_metrics(run_dir: Path) -> list[dict]:
    """Records of ``<run_dir>/metrics.jsonl`` (empty when missing)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def heartbeat_step(run_dir: Path) -> int | None:
    """Step number in ``<run_dir>/heartbeat``, or None before the first beat."""
    try:
        return int((run_dir / "heartbeat").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
