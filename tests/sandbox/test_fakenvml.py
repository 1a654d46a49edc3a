"""Real pynvml (nvidia-ml-py) over the fake libnvidia-ml, for every bundled scenario.

Each reading runs in a subprocess: the library path is fixed at first load
(``CDLL("libnvidia-ml.so.1")`` through ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sandbox.fakenvml import SCENARIO_ENV, build_fake_nvml, source_hash
from orchestrator.sandbox.scenario import SCENARIO_DIR, resize_scenario, scenario_names
from tests.sandbox.gpu3_reader import Gpu3Reader

READ_ALL = r"""
import json, sys, pynvml as n
out = {}
try:
    n.nvmlInit()
except n.NVMLError as e:
    print(json.dumps({"init_error": e.value, "message": str(e)})); sys.exit()
out["driver"] = n.nvmlSystemGetDriverVersion()
out["nvml"] = n.nvmlSystemGetNVMLVersion()
out["cuda"] = n.nvmlSystemGetCudaDriverVersion_v2()
out["devices"] = []
for i in range(n.nvmlDeviceGetCount()):
    try:
        h = n.nvmlDeviceGetHandleByIndex(i)
        m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        out["devices"].append({
            "index": n.nvmlDeviceGetIndex(h), "name": n.nvmlDeviceGetName(h),
            "uuid": n.nvmlDeviceGetUUID(h),
            "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
            "mem_used_mib": n.nvmlDeviceGetMemoryInfo(h).used >> 20,
            "mem_total_mib": n.nvmlDeviceGetMemoryInfo(h).total >> 20,
            "mem_v2_used_mib": m2.used >> 20,
            "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "power_mw": n.nvmlDeviceGetPowerUsage(h),
            "limit_mw": n.nvmlDeviceGetEnforcedPowerLimit(h),
            "procs": [[p.pid, p.usedGpuMemory >> 20] for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
            "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
            "bus": n.nvmlDeviceGetPciInfo(h).busId,
        })
    except n.NVMLError as e:
        out["devices"].append({"error": e.value, "message": str(e)})
n.nvmlShutdown()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("nvml")).parent


def run_py(code: str, lib_dir: Path, scenario: Path, timeout_s: float = 30, **popen: object):
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib_dir), SCENARIO_ENV: str(scenario)}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
        **popen,
    )  # type: ignore[call-overload]


def read(lib_dir: Path, scenario: Path) -> dict:
    return json.loads(run_py(READ_ALL, lib_dir, scenario).stdout)


def test_build_is_cached_by_source_hash(tmp_path: Path) -> None:
    lib = build_fake_nvml(tmp_path)
    mtime = lib.stat().st_mtime_ns
    assert build_fake_nvml(tmp_path) == lib and lib.stat().st_mtime_ns == mtime
    assert (tmp_path / ".libnvidia-ml.so.1.sha").read_text().strip() == source_hash()
    (tmp_path / ".libnvidia-ml.so.1.sha").write_text("stale\n")
    build_fake_nvml(tmp_path)
    assert lib.stat().st_mtime_ns != mtime


def test_every_bundled_scenario_loads_through_pynvml(lib_dir: Path) -> None:
    assert {"healthy", "idle", "ghost", "driver-mismatch", "gpu-lost", "gpu-hang"} <= set(
        scenario_names()
    )
    for name in scenario_names():
        if name == "gpu-hang":
            continue  # blocks 30 s per call on GPU 3; covered with a short hang below
        got = read(lib_dir, SCENARIO_DIR / f"{name}.json")
        assert "init_error" in got or "devices" in got, name


def test_healthy(lib_dir: Path) -> None:
    got = read(lib_dir, SCENARIO_DIR / "healthy.json")
    assert got["driver"] == "570.172.08" and got["cuda"] == 12080
    devs = got["devices"]
    assert len(devs) == 8
    assert {d["name"] for d in devs} == {"NVIDIA H200"}
    assert {d["mem_total_mib"] for d in devs} == {143771}
    assert [d["index"] for d in devs] == list(range(8))
    assert len({d["uuid"] for d in devs}) == 8
    for d in devs:
        assert (
            d["util"] >= 90
            and d["mem_used_mib"] > 50000
            and d["mem_v2_used_mib"] == d["mem_used_mib"]
        )
        assert len(d["procs"]) == 1 and 0 < d["procs"][0][1] <= d["mem_used_mib"]
        assert 100_000 < d["power_mw"] < d["limit_mw"] == 700_000
        assert d["graphics"] == 0 and d["bus"].startswith("00000000:")


def test_idle_seed_002(lib_dir: Path) -> None:
    devs = read(lib_dir, SCENARIO_DIR / "idle.json")["devices"]
    assert [(d["mem_used_mib"], d["util"], d["procs"]) for d in devs] == [(0, 0, [])] * 8


def test_ghost_seed_000(lib_dir: Path) -> None:
    devs = read(lib_dir, SCENARIO_DIR / "ghost.json")["devices"]
    assert [(d["index"], d["mem_used_mib"], d["util"]) for d in devs] == [
        (i, 0, 100 if i == 3 else 0) for i in range(8)
    ]
    assert devs[3]["procs"] == []


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        ("driver-mismatch", 18, "RM has detected an NVML/RM version mismatch."),
        ("driver-not-loaded", 9, "Driver Not Loaded"),
    ],
)
def test_init_errors(lib_dir: Path, name: str, code: int, message: str) -> None:
    got = read(lib_dir, SCENARIO_DIR / f"{name}.json")
    assert got == {"init_error": code, "message": message}


def test_no_scenario_file_is_driver_not_loaded(lib_dir: Path, tmp_path: Path) -> None:
    assert read(lib_dir, tmp_path / "missing.json")["init_error"] == 9


def test_gpu_lost(lib_dir: Path) -> None:
    devs = read(lib_dir, SCENARIO_DIR / "gpu-lost.json")["devices"]
    assert devs[3] == {"error": 15, "message": "GPU is lost"}
    assert all("error" not in d for i, d in enumerate(devs) if i != 3)


def test_lost_gpu_call_blocks_for_hang_ms(lib_dir: Path, tmp_path: Path) -> None:
    doc = json.loads((SCENARIO_DIR / "gpu-hang.json").read_text())
    assert doc["devices"][3]["hang_ms"] >= 10_000 and doc["devices"][3]["lost"]
    doc["devices"][3]["hang_ms"] = 700
    (tmp_path / "s.json").write_text(json.dumps(doc))
    code = (
        "import time, pynvml as n; n.nvmlInit(); t=time.monotonic()\n"
        "try: n.nvmlDeviceGetHandleByIndex(3)\n"
        "except n.NVMLError_GpuIsLost: print(time.monotonic()-t)\n"
        "t=time.monotonic(); n.nvmlDeviceGetHandleByIndex(2); print(time.monotonic()-t)"
    )
    slow, fast = map(float, run_py(code, lib_dir, tmp_path / "s.json").stdout.split())
    assert slow >= 0.69 and fast < 0.2


def test_process_structs_v1_v2_v3_agree(lib_dir: Path) -> None:
    code = (
        "import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(0)\n"
        "for f in (n.nvmlDeviceGetComputeRunningProcesses_v2, n.nvmlDeviceGetComputeRunningProcesses_v3):\n"
        "    print([(p.pid, p.usedGpuMemory >> 20, p.gpuInstanceId) for p in f(h)])\n"
    )
    lines = run_py(code, lib_dir, SCENARIO_DIR / "healthy.json").stdout.splitlines()
    assert lines == ["[(412301, 117712, 4294967295)]"] * 2


def test_memory_v2_checks_struct_version(lib_dir: Path) -> None:
    code = (
        "import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(0)\n"
        "try: n.nvmlDeviceGetMemoryInfo(h, version=1)\n"
        "except n.NVMLError as e: print(e.value)"
    )
    assert run_py(code, lib_dir, SCENARIO_DIR / "healthy.json").stdout.strip() == "25"


def test_scenario_switch_while_initialised(lib_dir: Path, tmp_path: Path) -> None:
    """One process keeps NVML initialised while the scenario file is replaced under it."""
    scenario = tmp_path / "live.json"
    scenario.write_text((SCENARIO_DIR / "healthy.json").read_text())
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib_dir), SCENARIO_ENV: str(scenario)}
    reader = Gpu3Reader([], sys.executable, env)
    try:
        ask = reader.ask
        assert ask() == "99 118033"
        for name, want in (
            ("ghost", "100 0"),
            ("gpu-lost", "error 15"),
            ("driver-mismatch", "error 18"),
            ("idle", "0 0"),
        ):
            tmp = tmp_path / "next.json"
            tmp.write_text((SCENARIO_DIR / f"{name}.json").read_text())
            os.replace(tmp, scenario)
            assert ask() == want, name
    finally:
        reader.close()


def test_resize_keeps_unique_uuids() -> None:
    doc = json.loads((SCENARIO_DIR / "healthy.json").read_text())
    assert len(resize_scenario(doc, 2)["devices"]) == 2
    big = resize_scenario(doc, 12)["devices"]
    assert len(big) == 12 and len({d["uuid"] for d in big}) == 12
    assert [d["index"] for d in big] == list(range(12))


def test_hang_does_not_block_other_threads(lib_dir: Path, tmp_path: Path) -> None:
    """A hung call (lost GPU) blocks only its own thread, as the agent's deadline relies on."""
    doc = json.loads((SCENARIO_DIR / "gpu-hang.json").read_text())
    doc["devices"][3]["hang_ms"] = 5000
    (tmp_path / "s.json").write_text(json.dumps(doc))
    code = (
        "import threading, time, pynvml as n; n.nvmlInit()\n"
        "threading.Thread(target=lambda: n.nvmlDeviceGetHandleByIndex(3), daemon=True).start()\n"
        "time.sleep(0.1); t=time.monotonic(); n.nvmlDeviceGetHandleByIndex(0); print(time.monotonic()-t)"
    )
    start = time.monotonic()
    assert float(run_py(code, lib_dir, tmp_path / "s.json").stdout) < 0.5
    assert time.monotonic() - start < 4.5


@pytest.mark.parametrize(
    ("numbering", "caller_is_host", "want"),
    [
        ("host", False, [[4242, 100], [5151, 200]]),  # 535.104.05: every host PID
        ("namespace", False, [[17, 100]]),  # 535.113.01: the caller's own, the rest left out
        ("namespace", True, [[4242, 100], [5151, 200]]),  # on the host: host PIDs
    ],
)
def test_pid_numbering_follows_the_callers_namespace(
    lib_dir: Path, tmp_path: Path, numbering: str, caller_is_host: bool, want: list
) -> None:
    """No container needed: the caller's own PID namespace stands for a container's, and
    ``host_pidns`` says whether it is the host's (kernel-open os_find_ns_pid's pid_vnr)."""
    mine = os.readlink("/proc/self/ns/pid")
    doc = resize_scenario(json.loads((SCENARIO_DIR / "idle.json").read_text()), 1)
    doc["devices"][0]["processes"] = [
        {"pid": 4242, "used_mib": 100, "pidns": mine, "ns_pid": 17},
        {"pid": 5151, "used_mib": 200, "pidns": "pid:[1]", "ns_pid": 17},
    ]
    doc.update(pid_numbering=numbering, host_pidns=mine if caller_is_host else "pid:[2]")
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(doc))
    assert read(lib_dir, scenario)["devices"][0]["procs"] == want
