"""The nvidia-smi, dmesg and journalctl stand-ins: the real tools' forms, messages and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sandbox.files import STANDIN_DIR
from orchestrator.sandbox.kernel import append_kernel_line
from orchestrator.sandbox.scenario import SCENARIO_DIR


def smi(scenario: str | Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = scenario if isinstance(scenario, Path) else SCENARIO_DIR / f"{scenario}.json"
    env = {**os.environ, "ORCH_FAKE_NVML_SCENARIO": str(path)}
    return subprocess.run(
        [sys.executable, str(STANDIN_DIR / "nvidia-smi"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


SEED_QUERY = ("--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader")


def test_seed_000_ghost_form() -> None:
    out = smi("ghost", *SEED_QUERY)
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"{i}, 0 MiB, {100 if i == 3 else 0} %" for i in range(8)]


def test_seed_002_idle_form() -> None:
    out = smi("idle", "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert out.stdout.split("\n")[:-1] == [f"{i}, 0 MiB" for i in range(8)]


def test_nounits_and_header() -> None:
    assert (
        smi(
            "ghost",
            "--query-gpu=index,memory.used,utilization.gpu",
            "--format=csv,noheader,nounits",
        ).stdout.splitlines()[3]
        == "3, 0, 100"
    )
    lines = smi(
        "healthy",
        "--query-gpu",
        "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw",
        "--format=csv",
    ).stdout.splitlines()
    assert lines[0] == (
        "index, uuid, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
        "temperature.gpu, power.draw [W]"
    )
    first = lines[1].split(", ")
    assert first[0] == "0" and first[1].startswith("GPU-") and first[2] == "NVIDIA H200"
    assert first[3:] == ["98 %", "118234 MiB", "143771 MiB", "58", "612.40 W"]
    assert len(lines) == 9


def test_compute_apps() -> None:
    out = smi("healthy", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader")
    rows = [r.split(", ") for r in out.stdout.splitlines()]
    assert (
        len(rows) == 8 and rows[0][:2] == ["412301", "117712 MiB"] and rows[0][2].startswith("GPU-")
    )
    assert (
        smi("ghost", "--query-compute-apps=pid,used_memory", "--format=csv,noheader").stdout == ""
    )
    assert (
        smi("ghost", "--query-compute-apps=pid,used_memory", "--format=csv").stdout
        == "pid, used_gpu_memory [MiB]\n"
    )


@pytest.mark.parametrize(
    ("scenario", "code", "text"),
    [
        ("driver-mismatch", 18, "Failed to initialize NVML: Driver/library version mismatch\n"),
        ("no-devices", 6, "No devices were found\n"),
        (
            "driver-not-loaded",
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver. Make sure that the latest NVIDIA driver is installed and running.\n",
        ),
    ],
)
def test_failures(scenario: str, code: int, text: str) -> None:
    out = smi(scenario, *SEED_QUERY)
    assert (out.returncode, out.stdout) == (code, text)


def test_lost_gpu_line_and_exit_15() -> None:
    out = smi("gpu-lost", *SEED_QUERY)
    lines = out.stdout.splitlines()
    assert out.returncode == 15 and len(lines) == 8
    assert lines[3].startswith(
        "Unable to determine the device handle for GPU 0000:5D:00.0: GPU is lost"
    )
    assert lines[4] == "4, 117655 MiB, 100 %"


def test_hang_blocks_then_answers(tmp_path: Path) -> None:
    doc = json.loads((SCENARIO_DIR / "gpu-hang.json").read_text())
    doc["devices"][3]["hang_ms"] = 600
    (tmp_path / "s.json").write_text(json.dumps(doc))
    start = time.monotonic()
    assert smi(tmp_path / "s.json", *SEED_QUERY).returncode == 15
    assert time.monotonic() - start >= 0.6


def test_unknown_field_and_list() -> None:
    bad = smi("healthy", "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout
    assert smi("healthy", "-L").stdout.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    assert smi("healthy", "-i", "3", *SEED_QUERY).stdout == "3, 118033 MiB, 99 %\n"


def kernel_tool(state: Path, tool: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_SANDBOX")}
    full.update(env or {"ORCH_SANDBOX_STATE": str(state)})
    return subprocess.run(
        [
            sys.executable,
            str(STANDIN_DIR / "dmesg"),
            *(("--as-journalctl",) if tool == "journalctl" else ()),
            *args,
        ],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_dmesg_forms(tmp_path: Path) -> None:
    at = time.time() - 30
    append_kernel_line(
        tmp_path,
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        level=3,
        at_s=at,
    )
    append_kernel_line(
        tmp_path,
        "Out of memory: Killed process 4242 (python3) total-vm:1000kB, "
        "anon-rss:900kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:10kB oom_score_adj:0",
    )
    plain = kernel_tool(tmp_path, "dmesg").stdout.splitlines()
    assert (
        len(plain) == 2
        and plain[0].startswith("[")
        and "] NVRM: Xid (PCI:0000:3b:00): 79," in plain[0]
    )
    iso = kernel_tool(tmp_path, "dmesg", "--time-format", "iso").stdout.splitlines()[0]
    assert iso.startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + ",")
    assert iso.endswith(" NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    ctime = kernel_tool(tmp_path, "dmesg", "-T").stdout.splitlines()[1]
    assert ctime.startswith("[") and "] Out of memory: Killed process 4242 (python3)" in ctime
    assert kernel_tool(tmp_path, "dmesg", "--since", "-10s").stdout.count("\n") == 1
    assert kernel_tool(tmp_path, "dmesg", "--level", "err").stdout.count("\n") == 1
    assert kernel_tool(tmp_path, "dmesg", "--bogus").returncode == 1


def test_journalctl_forms(tmp_path: Path) -> None:
    at = time.time() - 100
    append_kernel_line(
        tmp_path, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", at_s=at
    )
    out = kernel_tool(
        tmp_path, "journalctl", "-k", "--since", f"@{int(at) - 1}", "-o", "short-unix", "--no-pager"
    ).stdout
    assert (
        out
        == f"{at:.6f} sandbox kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    )
    assert (
        kernel_tool(tmp_path, "journalctl", "-k", "--since", "-10s").stdout == "-- No entries --\n"
    )
    assert kernel_tool(tmp_path, "journalctl", "-k", "-q", "--since", "-10s").stdout == ""
    row = json.loads(kernel_tool(tmp_path, "journalctl", "-k", "-o", "json").stdout)
    assert (
        row["MESSAGE"].startswith("NVRM: Xid")
        and abs(int(row["__REALTIME_TIMESTAMP"]) - at * 1e6) <= 2
    )


def test_dmesg_refused_inside_a_container(tmp_path: Path) -> None:
    out = kernel_tool(tmp_path, "dmesg", ORCH_SANDBOX_VMID="200")
    assert (out.returncode, out.stderr) == (
        1,
        "dmesg: read kernel buffer failed: Operation not permitted\n",
    )
