"""The torch-free stand-in (trainer/standin.py) keeps the trainer's output contract
(docs/trainer.md): metrics lines the real regex parses, metrics.jsonl, heartbeat, checkpoints,
``--resume auto``, faults and exit codes, and never imports torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import wait_for
from trainer.metrics import parse_line

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "trainer" / "configs" / "tiny-cpu.yaml")
NO_TORCH = "import sys; sys.modules['torch'] = None; import runpy; runpy.run_module('trainer', run_name='__main__')"
"""``python -m trainer`` where ``import torch`` fails: the stand-in must never need it."""


def _env(step_s: str = "0.01") -> dict[str, str]:
    return {**os.environ, "TRAINER_STAND_IN": "1", "TRAINER_STAND_IN_STEP_S": step_s}


def _run(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, "--config", TINY, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=_env(),
    )


def test_lines_files_crash_once_and_resume(tmp_path: Path) -> None:
    args = ("--steps", "30", "--fault", "crash-once@25", "--set", "train.ckpt_every=10")
    first = _run(tmp_path, *args, "--set", "train.log_every=5")
    assert first.returncode == 1, first.stderr
    assert first.stderr.strip().endswith("RuntimeError: injected fault: crash at step 25")
    steps = [m["step"] for x in first.stdout.splitlines() if (m := parse_line(x))]
    assert steps == [5, 10, 15, 20], first.stdout
    assert (tmp_path / "heartbeat").read_text().split()[0] == "24"
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_0000010.pt", "step_0000020.pt"]
    second = _run(tmp_path, *args, "--set", "train.log_every=1", "--resume", "auto")
    assert second.returncode == 0, second.stderr
    assert "trainer: resumed from " in second.stdout and " at step=20 " in second.stdout
    assert "trainer: finished step=30 " in second.stdout
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records][4:6] == [21, 22]
    assert records[-1]["schema_version"] == 2 and records[-1]["tokens"] == 30 * 8 * 64


def test_silent_exit_bad_config_and_a_real_checkpoint(tmp_path: Path) -> None:
    assert _run(tmp_path, "--steps", "9", "--fault", "silent-exit@3:7").returncode == 7
    bad = _run(tmp_path, "--set", "train.lr=fast")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "train.lr" in bad.stderr
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_0000050.pt").write_bytes(b"PK\x03\x04 torch zip")
    res = _run(tmp_path, "--steps", "3", "--resume", "auto")
    assert res.returncode == 0 and "skipping unreadable checkpoint" in res.stderr
    assert "trainer: resume: no valid checkpoint, starting at step=0" in res.stdout


def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", NO_TORCH, "--config", TINY, "--run-dir", str(tmp_path), "--forever"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(),
    )
    wait_for(lambda: (tmp_path / "heartbeat").exists(), 30, what="the first step")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("trainer: stopped by SIGTERM at step=") and "step_" in last, last
    assert "steps=forever" in out
