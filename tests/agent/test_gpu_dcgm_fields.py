"""dcgm-exporter's default fields read by the agent's collector: real pynvml over the fake
libnvidia-ml (each reading in a subprocess: the library loads once per process), and the
nvidia-smi fallback over the sandbox's stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.agent.conftest import SANDBOX, AgentEnv

COLLECT_TWICE = r"""
import json, sys, time
from orchestrator.agent.gpu import GpuCollector
c = GpuCollector(deadline_s=15, source=sys.argv[1], smi=sys.argv[2])
first, _ = c.collect()
time.sleep(0.5)
samples, status = c.collect()
print(json.dumps({"first": [g.to_dict() for g in first], "gpus": [g.to_dict() for g in samples],
                  "status": status.to_dict()}))
"""

FULL = {
    "index": 0,
    "util_pct": 90,
    "mem_util_pct": 41,
    "mem_used_mib": 1000,
    "mem_reserved_mib": 512,
    "temp_c": 60,
    "mem_temp_c": 71,
    "power_w": 600,
    "power_limit_w": 650,
    "sm_clock_mhz": 1410,
    "mem_clock_mhz": 2619,
    "pstate": 2,
    "energy_avg_w": 500,
    "pcie_replay": 7,
    "remapped_rows_correctable": 3,
    "remapped_rows_uncorrectable": 1,
    "remap_pending": 0,
    "remap_failure": 1,
    "enc_util_pct": 5,
    "dec_util_pct": 9,
    "nvlink_rx_kib_s": 2_000_000,
    "nvlink_tx_kib_s": 1_000_000,
}
LACKING = {
    "index": 1,
    "not_supported": [
        "NVML_FI_DEV_MEMORY_TEMP",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEncoderUtilization",
    ],
    "nvlink_links": 0,
}


def _scenario(env: AgentEnv, devices: list[dict]) -> None:
    tmp = env.scenario_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"driver_version": "570.172.08", "devices": devices}))
    os.replace(tmp, env.scenario_file)


def _collect(source: str, smi: str = "nvidia-smi") -> dict:
    out = subprocess.run(
        [sys.executable, "-c", COLLECT_TWICE, source, smi],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    return json.loads(out.stdout)


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def test_every_field_comes_from_its_nvml_call(agent_env: AgentEnv) -> None:
    _scenario(agent_env, [FULL, LACKING])
    before = _uptime_s()
    got = _collect("nvml")
    after = _uptime_s()
    assert got["status"]["ok"], got["status"]
    full, lacking = got["gpus"]
    assert (full["sm_clock_mhz"], full["mem_clock_mhz"], full["pstate"]) == (1410.0, 2619.0, 2)
    assert (full["power_limit_w"], full["memory_temp_c"], full["mem_copy_util_pct"]) == (
        650.0,
        71.0,
        41.0,
    )
    assert (full["pcie_replay_count"], full["memory_reserved_mib"]) == (7, 512.0)
    assert (full["remapped_rows_correctable"], full["remapped_rows_uncorrectable"]) == (3, 1)
    assert (full["remapped_rows_pending"], full["row_remap_failure"]) == (False, True)
    assert (full["encoder_util_pct"], full["decoder_util_pct"]) == (5.0, 9.0)
    # energy: mJ since boot at the scenario's 500 W (fakenvml.c), read between the two uptimes
    assert 500_000 * (before - 1) <= full["energy_mj"] <= 500_000 * (after + 1)
    # NVLink: DCGM's rate, (rx + tx KiB) difference / s / 1000, from the second reading on
    assert got["first"][0]["nvlink_bandwidth_mib_s"] is None
    assert abs(full["nvlink_bandwidth_mib_s"] - 3000.0) < 60, full["nvlink_bandwidth_mib_s"]
    # what the board lacks is None (no series), never 0; what it has still reads
    for key in (
        "memory_temp_c",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "row_remap_failure",
        "pcie_replay_count",
        "energy_mj",
        "encoder_util_pct",
        "nvlink_bandwidth_mib_s",
    ):
        assert lacking[key] is None, (key, lacking[key])
    assert lacking["sm_clock_mhz"] == 1980.0 and lacking["decoder_util_pct"] == 0.0
    assert lacking["error"] is None


def test_a_lost_gpu_is_lost_for_the_new_calls_too(agent_env: AgentEnv) -> None:
    _scenario(agent_env, [FULL, {**LACKING, "lost": True}])
    got = _collect("nvml")
    assert got["gpus"][1]["error"] == "gpu-lost" and got["gpus"][1]["sm_clock_mhz"] is None
    assert got["gpus"][0]["sm_clock_mhz"] == 1410.0


def test_nvidia_smi_gives_the_fields_its_query_has(agent_env: AgentEnv) -> None:
    _scenario(agent_env, [FULL, LACKING])
    got = _collect("nvidia-smi")
    full, lacking = got["gpus"]
    assert got["status"]["source"] == "nvidia-smi" and got["status"]["ok"], got["status"]
    assert (full["sm_clock_mhz"], full["mem_clock_mhz"], full["pstate"]) == (1410.0, 2619.0, 2)
    assert (full["power_limit_w"], full["memory_temp_c"], full["memory_reserved_mib"]) == (
        650.0,
        71.0,
        512.0,
    )
    assert (full["mem_copy_util_pct"], full["encoder_util_pct"]) == (41.0, 5.0)
    assert full["energy_mj"] is None and full["remapped_rows_correctable"] is None  # not in it
    assert lacking["memory_temp_c"] is None and lacking["sm_clock_mhz"] == 1980.0  # [N/A]


def test_an_nvidia_smi_that_refuses_a_field_is_asked_the_seed_fields(
    agent_env: AgentEnv, tmp_path: Path
) -> None:
    """An older nvidia-smi refuses a field it does not know, with the message and exit code 2
    of the real tool (which the stand-in copies), and prints no row at all."""
    _scenario(agent_env, [FULL])
    old = tmp_path / "nvidia-smi"
    old.write_text(
        "#!/bin/sh\n"
        'case "$*" in *memory.reserved*) '
        "echo 'Field \"memory.reserved\" is not a valid field to query.'; exit 2;; esac\n"
        f'exec {SANDBOX / "bin" / "nvidia-smi"} "$@"\n'
    )
    old.chmod(0o755)
    got = _collect("nvidia-smi", str(old))
    (gpu,) = got["gpus"]
    assert got["status"]["ok"], got["status"]
    assert gpu["utilization_pct"] == 90.0 and gpu["sm_clock_mhz"] is None
