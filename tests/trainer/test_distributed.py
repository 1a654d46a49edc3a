"""torchrun --nproc_per_node 2 on CPU (gloo, loopback) matches one process on the combined batch."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.procs import ROOT, TINY, trainer_env
from trainer import checkpoint
from trainer.config import for_local_rank, load_config
from trainer.pipeline import RunOptions, Trainer

STEPS = 4
SETS = ["devices.drafter=[cpu]", f"train.steps={STEPS}", "train.log_every=1"]


@pytest.mark.slow
def test_torchrun_two_processes_match_single_process(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    single = Trainer(
        load_config(TINY, SETS), RunOptions(tmp_path / "single", log_out=io.StringIO())
    )
    single.run_pipelined(STEPS)

    run = tmp_path / "ddp"
    argv = [
        torchrun,
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "trainer",
        "--config",
        str(TINY),
        "--run-dir",
        str(run),
    ]
    for item in SETS:
        argv += ["--set", item]
    env = trainer_env() | {"GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "world_size=2" in proc.stdout
    assert proc.stdout.count("trainer: finished") == 1  # only rank 0 talks
    loaded = checkpoint.load_latest(run)
    assert loaded is not None and loaded.step == STEPS and loaded.state["world_size"] == 2
    ref = single.replicas[0].state_dict()
    start = Trainer(load_config(TINY, SETS), RunOptions(tmp_path / "init", log_out=io.StringIO()))
    moved = max(float((ref[k] - v).abs().max()) for k, v in start.replicas[0].state_dict().items())
    assert moved > 1e-3
    diff = max(float((ref[k] - loaded.state["drafter"][k]).abs().max()) for k in ref)
    assert diff < 1e-5, diff
    print(f"torchrun vs single process: max |delta param| = {diff:.2e}", file=sys.stderr)
    assert torch.isfinite(torch.tensor(diff))


def test_devices_follow_torchrun_local_rank(tmp_path: Path) -> None:
    """Under torchrun the config names one process's devices; ``LOCAL_RANK`` r shifts its CUDA
    indices by r x (highest + 1), so two ranks on a node never share a GPU. Here torch sees no
    CUDA device, so the shifted set is refused with a one-line error naming it (exit 2)."""
    config = tmp_path / "gpus.yaml"
    config.write_text(
        TINY.read_text()
        .replace("target: [cpu]", "target: [cuda:0]")
        .replace("drafter: [cpu, cpu]", "drafter: [cuda:1, cuda:2]")
    )
    env = trainer_env() | {"LOCAL_RANK": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--config",
            str(config),
            "--run-dir",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (
        "error: devices: the run needs cuda:3..cuda:5 (LOCAL_RANK=1: each local rank gets its "
        "own set), but torch sees 0 CUDA device(s)\n"
    )
    two = for_local_rank(load_config(config), 2).devices
    assert (two.target, two.drafter) == (["cuda:6"], ["cuda:7", "cuda:8"])
