"""The GPU check, one prepared script (under 8 minutes on one H200): run it on a GPU machine.

1. The bundled trainer on GPU 0, target and drafter sharing it:
   - the copy task (tiny-cpu's target kind, scaled up): ``tau``, ``tau_no_context``, target
     tok/s, peak memory, the evaluation's time and peak;
   - the built-in LM target at the 8-GPU config's width (2048, bf16, fewer layers), on-policy:
     tok/s and peak memory of a real-size step (``gpu_mem``, ``torch.cuda.max_memory_allocated``).
2. The agent's real NVML path: ``orch snapshot local --json`` (the CLI, through the deployed
   agent and pynvml), then ``--samples`` in-process snapshots of the same target fed to the
   ``ghost-utilization`` detector with the default limits: on an idle GPU it must stay silent
   (``ghost_false_positive: false``); the GPUs' utilisation and memory are reported.

Prints one JSON object last. ``--dry-run`` runs the same script end to end on CPU: tiny shapes,
a few steps, and the agent's NVML path against the sandbox's fake ``libnvidia-ml.so.1`` (built
with the system C compiler) set to one idle GPU.

    python bench/gpu.py              # on the GPU machine
    python bench/gpu.py --dry-run    # anywhere (CPU), about a minute
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.trainer import baselines  # noqa: E402  (after the path tweak)
from trainer.config import load_config, with_steps  # noqa: E402
from trainer.pipeline import RunOptions, Trainer  # noqa: E402

TINY = ROOT / "trainer/configs/tiny-cpu.yaml"
COPY_GPU = [
    "target.vocab_size=256",
    "target.d_model=512",
    "target.n_layers=8",
    "target.copy_period=64",
    "drafter.d_model=512",
    "drafter.n_layers=4",
    "drafter.n_heads=8",
    "drafter.d_ff=1536",
    "drafter.block_size=8",
    "drafter.target_layers=[1,4,7]",
    "data.seq_len=512",
    "data.prompt_len=64",
    "data.pool=256",
    "train.batch_size=16",
    "train.blocks_per_seq=16",
    "train.eval_every=100",
    "train.eval_seqs=16",
    "train.log_every=50",
    "train.torch_threads=0",
    "train.loss_decay_gamma=4.0",
    "train.lr=1.0e-3",
    "train.warmup_steps=20",
]
LM_GPU = [
    "target.kind=lm",
    "target.vocab_size=32000",
    "target.d_model=2048",
    "target.n_layers=8",
    "target.n_heads=16",
    "target.d_ff=5632",
    "target.dtype=bfloat16",
    "drafter.d_model=2048",
    "drafter.n_layers=2",
    "drafter.n_heads=16",
    "drafter.d_ff=5632",
    "drafter.block_size=16",
    "drafter.target_layers=[1,3,5]",
    "data.seq_len=2048",
    "data.prompt_len=64",
    "data.pool=8",
    "train.batch_size=4",
    "train.blocks_per_seq=32",
    "train.eval_every=10",
    "train.eval_seqs=2",
    "train.eval_chunk_rows=16",
    "train.log_every=5",
    "train.grad_checkpoint=true",
    "train.torch_threads=0",
    "train.loss_decay_gamma=7.0",
]
DRY_LM = ["target.kind=lm", "target.dtype=bfloat16", "train.eval_every=5", "train.log_every=5"]
LATCHED = {"util_pct": 100, "mem_used_mib": 0, "power_w": 110}
"""Seed 000's ghost (100 % busy, 0 MiB, no process): the dry run's proof the check can fire."""
IDLE_GPU = {
    "driver_version": "570.124.06",
    "cuda_driver_version": 12080,
    "devices": [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "util_pct": 0,
            "mem_used_mib": 1,
            "mem_total_mib": 143771,
            "power_w": 75,
            "power_limit_w": 700,
            "processes": [],
        },
    ],
}


def train(overrides: list[str], steps: int, device: str) -> dict[str, Any]:
    """One pipelined run on ``device`` (target and drafter both there): its figures."""
    devs = [f"devices.target=[{device}]", f"devices.drafter=[{device}]"]
    cfg = with_steps(load_config(TINY, [*overrides, *devs]), steps)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        t0 = time.monotonic()
        trainer = Trainer(cfg, RunOptions(Path(tmp), log_out=io.StringIO()))
        build_s = time.monotonic() - t0
        try:
            trainer.warmup("sequential")
            result = trainer.run_pipelined(steps)
            extra = baselines(trainer) if cfg.target.kind == "copy" else {}
        finally:
            trainer.close()
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.startswith("cuda") else None
    last = result.last
    figures = {
        "steps": steps,
        "tok_s": round(result.tok_s, 1),
        "tau": None if last is None else last.tau,
        "build_s": round(build_s, 2),
        "wall_s": round(result.wall_s, 2),
        "peak_mib": None if peak is None else round(peak, 1),
    }
    figures.update({k: None if v is None else round(v, 3) for k, v in extra.items()})
    return figures


def orch_env(dry_run: bool, tmp: Path, scenario: dict[str, Any] = IDLE_GPU) -> dict[str, str]:
    """The environment of the ``orch`` calls: an empty inventory (only ``local``) in ``tmp``;
    for a dry run, the fake NVML library on ``LD_LIBRARY_PATH`` reading one idle GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["ORCH_CONFIG"] = str(tmp / "hosts.yaml")
    (tmp / "hosts.yaml").write_text(f"containers:\n  local:\n    workdir: {tmp / 'work'}\n")
    if dry_run:
        from orchestrator.sandbox.fakenvml import SCENARIO_ENV, build_fake_nvml

        lib = build_fake_nvml(tmp / "nvml")
        (tmp / "scenario.json").write_text(json.dumps(scenario))
        env["LD_LIBRARY_PATH"] = f"{lib.parent}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
        env[SCENARIO_ENV] = str(tmp / "scenario.json")
    return env


GHOST = """
import json, sys, time
from orchestrator.commands._app import load_inventory
from orchestrator.config.limits import Limits
from orchestrator.detect.gpu import ghost_utilization
from orchestrator.remote.target import Target
limits, target, snaps = Limits(), Target(load_inventory(), "local"), []
for _ in range(max(int(sys.argv[1]), limits.ghost_samples)):
    snaps.append(target.snapshot())
    time.sleep(float(sys.argv[2]))
found = ghost_utilization(snaps, limits)
print(json.dumps({"samples": len(snaps), "ghost_findings": [f.summary for f in found],
                  "gpus": [[g.index, g.utilization_pct, g.memory_used_mib] for g in snaps[-1].gpus]}))
"""


def nvml_path(
    dry_run: bool, samples: int, interval_s: float, scenario: dict[str, Any] = IDLE_GPU
) -> dict[str, Any]:
    """``orch snapshot local --json`` and the ghost check (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-orch-") as tmp:
        env = orch_env(dry_run, Path(tmp), scenario)
        t0 = time.monotonic()
        snap = subprocess.run(
            [
                sys.executable,
                "-c",
                "from orchestrator.cli import main; main()",
                "snapshot",
                "local",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        snapshot_s = time.monotonic() - t0
        if snap.returncode != 0:
            return {"snapshot_rc": snap.returncode, "snapshot_error": snap.stderr.strip()[-400:]}
        doc = json.loads(snap.stdout)
        ghost = subprocess.run(
            [sys.executable, "-c", GHOST, str(samples), str(interval_s)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if ghost.returncode != 0:
            return {"snapshot_rc": 0, "ghost_error": ghost.stderr.strip()[-400:]}
        check = json.loads(ghost.stdout.strip().splitlines()[-1])
    nvml = doc.get("nvml") or {}
    return {
        "snapshot_rc": 0,
        "snapshot_s": round(snapshot_s, 2),
        "nvml_ok": bool(nvml.get("ok")),
        "driver": nvml.get("driver_version"),
        "gpus_seen": len(doc.get("gpus") or []),
        "ghost_samples": check["samples"],
        "ghost_false_positive": bool(check["ghost_findings"]),
        "ghost_findings": check["ghost_findings"],
        "gpus_last": check["gpus"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, fake NVML")
    p.add_argument("--samples", type=int, default=6, help="snapshots for the ghost check")
    p.add_argument("--json", action="store_true", help="(always) one JSON object last")
    args = p.parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("error: no CUDA device here; use --dry-run on CPU", file=sys.stderr)
        return 2
    device = "cpu" if dry else "cuda:0"
    t0 = time.monotonic()
    out: dict[str, Any] = {"dry_run": dry, "torch": torch.__version__, "device": device}
    if not dry:
        out["gpu_name"] = torch.cuda.get_device_name(0)
    copy_steps, lm_steps = (20, 5) if dry else (400, 30)
    out["copy_task"] = train([] if dry else COPY_GPU, copy_steps, device)
    print(f"bench-gpu: copy task {out['copy_task']}", flush=True)
    out["lm_bf16"] = train(DRY_LM if dry else LM_GPU, lm_steps, device)
    print(f"bench-gpu: lm bf16 {out['lm_bf16']}", flush=True)
    if not dry:
        torch.cuda.empty_cache()  # the GPU idle again, as far as this process goes
    out["nvml"] = nvml_path(dry, args.samples, 0.0 if dry else 1.0)
    print(f"bench-gpu: nvml {out['nvml']}", flush=True)
    if dry:  # the same check on a latched GPU must fire, or "no ghost" above proves nothing
        latched = {**IDLE_GPU, "devices": [{**IDLE_GPU["devices"][0], **LATCHED}]}  # type: ignore[dict-item]
        out["nvml_latched"] = nvml_path(dry, args.samples, 0.0, latched)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
