"""The trainer as one node of a multi-node torchrun job: every node's local rank 0
logs its own steps and its node's tokens/s, ``--dist-timeout`` bounds a collective, and
``kill@STEP:RANK`` kills one rank as kill -9 would. Two torchrun agents on this machine, each
its own node (``--nnodes 2``, c10d rendezvous on loopback, distinct ``--local-addr``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.trainer.procs import ROOT, heartbeat_step, read_metrics, run_trainer, trainer_env

INSTANT = ROOT / "trainer" / "configs" / "instant-cpu.yaml"


def _node(rank: int, port: int, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "t",
        "--local-addr",
        f"127.0.0.{rank + 1}",
        "--max-restarts",
        "0",
        # only node 0 serves the store: both share 127.0.0.1, which torchrun would take
        # for "mine" on each (then both bind the port, and the loser fails with EADDRINUSE)
        "--rdzv-conf",
        f"is_host={1 if rank == 0 else 0}",
        "-m",
        "trainer",
        "--config",
        str(INSTANT),
        "--run-dir",
        str(run_dir),
        "--set",
        "train.batch_size=8",
        "--set",
        "train.log_every=2",
        *extra,
    ]
    env = trainer_env() | {"GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_two_nodes_each_log_their_steps_and_one_rank_dies_alone(tmp_path: Path) -> None:
    port = free_port()
    nodes = [
        _node(
            r,
            port,
            tmp_path / f"n{r}",
            "--steps",
            "40",
            "--fault",
            "kill@21:1",
            "--dist-timeout",
            "30",
        )
        for r in (0, 1)
    ]
    try:
        out = [p.communicate(timeout=240)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    for r, text in enumerate(out):  # each node's own banner and steps, before the kill
        assert f"trainer: world_size=2 rank={r} local_rank=0 " in text, text[-3000:]
        assert "step=20 " in text, text[-3000:]
        assert [m["step"] for m in read_metrics(tmp_path / f"n{r}")][:10] == list(range(2, 21, 2))
    assert "faults kill@21:1" in out[0]
    assert "exitcode  : -9" in out[1] and "Signal 9 (SIGKILL) received by PID" in out[1], out[1][
        -3000:
    ]
    assert heartbeat_step(tmp_path / "n1") == 20  # rank 1 died before step 21, no flush
    # rank 0 did not die of the fault: its error is the lost peer (or its agent's teardown)
    assert "exitcode  : -9" not in out[0], out[0][-3000:]
    tokens = [read_metrics(tmp_path / f"n{r}")[0]["tokens"] for r in (0, 1)]
    assert tokens == [2 * 8 * 8 // 2] * 2  # each node counts its own ranks' tokens: half of all


def test_kill_fault_kills_the_process_like_kill_9(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = run_trainer(tmp_path, "--steps", "8", "--fault", "kill@4", "--set", "train.log_every=1")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr == "" and "trainer: finished" not in proc.stdout
    assert heartbeat_step(tmp_path) == 3
    assert time.monotonic() - t0 < 120


def test_dist_timeout_is_checked(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--dist-timeout", "soon")
    assert proc.returncode == 2
    assert "argument --dist-timeout: not a number of seconds: 'soon'" in proc.stderr
