"""``--forever``: the run lasts until it is stopped, however fast the machine trains."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.helpers import wait_for
from tests.trainer.procs import ROOT, heartbeat_step, run_trainer, trainer_cmd, trainer_env

INSTANT = ROOT / "trainer" / "configs" / "instant-cpu.yaml"


def test_forever_trains_past_the_configured_steps_until_sigterm(tmp_path: Path) -> None:
    """instant-cpu is configured for 200 steps; --forever goes past them and ends on SIGTERM
    with the documented 143 and a checkpoint, the LR held at its peak after the warm-up."""
    proc = subprocess.Popen(
        trainer_cmd(tmp_path, "--forever", "--set", "train.log_every=50", config=INSTANT),
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (heartbeat_step(tmp_path) or 0) > 250,
            timeout_s=120,
            what="step 250, past the config's 200",
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert " steps=forever " in out
    assert "trainer: stopped by SIGTERM at step=" in out
    lrs = {line.split("lr=")[1].split()[0] for line in out.splitlines() if line.startswith("step=")}
    assert lrs == {"3.0e-03"}, lrs  # no decay: step 50 and on are past the 10 warm-up steps


def test_forever_and_steps_exclude_each_other(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--forever", "--steps", "5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --forever: steps: trains until stopped; drop --steps"
