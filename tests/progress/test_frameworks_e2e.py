"""Stall and throughput-drop on the user's own frameworks, in the sandbox: ``orch launch`` runs
a script printing HF Trainer's and torchtitan's real line formats (fast steps, then slower
ones, then a hang; the fast phase lasts 12 s, so a watch that starts late on a loaded machine
still sees the baseline's 10 samples); the ``orch watch`` path (``observe.stream`` and the detectors) must call
the slowdown a throughput drop in the framework's own unit and the hang a stall.

The line formats are those of docs/progress.md's readers: transformers' ProgressCallback
(a tqdm training bar, one per line as a log file holds them when tqdm's output is
line-buffered, and ``str(logs)`` dicts with 5.x's ``'{v:.4g}'`` strings), torchtitan
v0.1.0 MetricsProcessor.log (with its ANSI colours).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import run as orch_run
from orchestrator.wire.model import Finding, Metrics, Snapshot
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

THRESHOLDS = {
    "stall_timeout_s": 8,
    "throughput_samples": 3,
    "throughput_drop_ratio": 0.5,
    "throughput_baseline_samples": 10,
    "startup_grace_s": 3600,
}

HF_SCRIPT = r"""
import sys, time
total = 400
def bar(n, rate):
    pct = n * 100 // total
    print(f" {pct:>2}%|#         | {n}/{total} [00:{n % 60:02d}<05:00, {rate:5.2f}it/s]", flush=True)
print("***** Running training *****", flush=True)
for n in range(1, 61):
    bar(n, 10.0); time.sleep(0.2)
    if n % 10 == 0:
        print("{'loss': '%.4g', 'grad_norm': '1.2', 'learning_rate': '5e-05', 'epoch': %.2f}"
              % (2.5 - n / 100, n / total), flush=True)
for n in range(61, 75):
    bar(n, 1.0); time.sleep(1.0)
time.sleep(3600)
"""

TITAN_SCRIPT = r"""
import time
R, G, Y, B, C, M, X = (f"\x1b[{c}m" for c in (31, 32, 33, 34, 36, 35, 39))
def line(step, tps):
    print(f"[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - {R}step: {step:2}  "
          f"{G}loss:  6.1384  {Y}memory: 49.66GiB(52.28%)  {B}tps: {tps:,}  "
          f"{C}tflops: 339.16  {M}mfu: 34.29%{X}", flush=True)
for s in range(1, 61):
    line(s, 5862); time.sleep(0.2)
for s in range(61, 75):
    line(s, 1204); time.sleep(1.0)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def config(sandbox_config: Callable[..., Path]) -> Path:
    return sandbox_config("progress", thresholds=THRESHOLDS, poll_interval=1, gpus={})


def _orch(config: Path, tmp: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORCH_DB", str(tmp / "orch.db"))
        mp.setenv("XDG_STATE_HOME", str(tmp / "state"))
        code = orch_run(["-c", str(config), *args])
    return code, out.getvalue()


class Watch:
    """The ``orch watch`` path for one target, in a thread: every finding with its snapshot."""

    def __init__(self, target: Any) -> None:
        self.target, self.history = target, []  # type: ignore[var-annotated]
        self.found: list[Finding] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="progress-watch")
        self.thread.start()

    def _run(self) -> None:
        from orchestrator.detect.engine import run_detectors
        from orchestrator.monitor import observe

        for snap in observe.stream(self.target, 1.0):
            self.history.append(snap)
            self.found += run_detectors(
                self.history, limits=self.target.container.limits, now=snap.taken_at
            )
            if self.stop.is_set():
                return

    def first(self, kind: str) -> Finding | None:
        return next((f for f in list(self.found) if f.kind == kind), None)

    def metrics(self) -> Snapshot | None:
        return next((s for s in reversed(self.history) if s.metrics is not None), None)


@contextlib.contextmanager
def launched(config: Path, tmp: Path, name: str, script: str) -> Iterator[Watch]:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.target import Target
    from orchestrator.wire.quoting import command_line

    inventory = load_inventory(config)
    c = inventory.container(name)
    cmd = command_line([c.python, "-u", "-c", script])
    code, out = _orch(config, tmp, "launch", name, "--cmd", cmd, "--no-verify", "--json")
    assert code == 0, out
    watch = Watch(Target(inventory, name))
    try:
        yield watch
    finally:
        watch.stop.set()
        _orch(config, tmp, "stop", name, "--grace", "2")
        watch.thread.join(timeout=30)


def _both(watch: Watch, unit: str) -> tuple[Finding, Finding, Metrics]:
    """The drop (in ``unit``), the stall, and the newest metrics the stream carried."""
    drop = wait_for(lambda: watch.first("throughput-drop"), 150, 0.5, "a throughput drop")
    stall = wait_for(lambda: watch.first("stall"), 150, 0.5, "a stall")
    assert drop.summary.startswith(f"{unit} fell to"), drop.summary
    snap = watch.metrics()
    assert snap is not None and snap.metrics is not None
    return drop, stall, snap.metrics


RUNS = {
    "hf-trainer": ("ct200", HF_SCRIPT, "it/s", "fell to 1.00 from a baseline of 10.00", 400),
    "torchtitan": (
        "ct201",
        TITAN_SCRIPT,
        "tokens/s/device",
        "fell to 1,204 from a baseline of 5,862",
        None,
    ),
}


@pytest.mark.parametrize("framework", list(RUNS))
def test_run_drops_in_its_own_unit_then_stalls(
    framework: str, config: Path, tmp_path: Path, sandbox: Any
) -> None:
    ct, script, unit, fell, total = RUNS[framework]
    with launched(config, tmp_path, ct, script) as watch:
        drop, stall, m = _both(watch, unit)
        assert fell in drop.summary, drop.summary
        assert (m.framework, m.total_steps, m.throughput_unit) == (framework, total, unit)
        assert (m.step, m.tokens_per_s) == (74, None) and m.loss is not None
        assert "last step 74" in stall.evidence, stall.evidence
        code, out = _orch(config, tmp_path, "check", ct, "--json", "--critical", "none")
        [target] = json.loads(out)["targets"]
        assert target["progress"]["framework"] == framework
        assert target["progress"]["throughput"]["unit"] == unit
