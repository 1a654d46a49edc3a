"""dcgm-exporter's other default fields (etc/default-counters.csv, tag 4.5.3-4.8.2), each from
the NVML call DCGM reads it from (NVIDIA/DCGM 4.x, dcgmlib/src/DcgmCacheManager.cpp), for
:class:`~orchestrator.agent.gpu.GpuCollector`: clocks, P-state, power limit, energy, PCIe
replays, remapped rows, reserved memory, encoder/decoder utilisation, and through
``nvmlDeviceGetFieldValues`` the memory temperature and NVLink throughput.

A reading the device lacks (``NVML_ERROR_NOT_SUPPORTED`` from the call, or in a field value's
own ``nvmlReturn``) is ``None``: no series, never 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# nvml.h's numbers, spelled out: an older pynvml in a container may not name them.
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PSTATE_UNKNOWN = 32
NVML_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: the struct version nvmlDeviceGetMemoryInfo_v2 checks
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139  # KiB
ALL_LINKS = 0xFFFFFFFF
"""The scopeId that asks an NVLink field for every link together (DCGM 4.x,
dcgmlib/src/DcgmCacheManager.cpp, ReadAndCacheNvLinkBandwidth)."""

NvlinkReading = tuple[int, int]
"""An NVLink reading kept for the next rate: (rx + tx KiB, NVML timestamp in microseconds)."""
Field = Callable[[Callable[[], Any], str], Any]
"""Runs one NVML call under its step name: its value, ``None`` when not supported; a device
error propagates (``GpuCollector._field``)."""


def read_more(
    nv: Any, h: Any, index: int, field: Field, previous: NvlinkReading | None
) -> tuple[dict[str, Any], NvlinkReading | None]:
    """The fields of GPU ``index`` (handle ``h``, pynvml module ``nv``) as GpuSample keyword
    arguments, and the NVLink reading to keep for the next call (``previous`` is the last one).

    Raises:
        pynvml.NVMLError: a device error (``field`` lets only "not supported" through).
    """
    calls: dict[str, tuple[str, Callable[[], Any]]] = {
        "sm": ("GetClockInfo", lambda: nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)),
        "mem": ("GetClockInfo", lambda: nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM)),
        "limit": ("GetEnforcedPowerLimit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
        "pstate": ("GetPerformanceState", lambda: nv.nvmlDeviceGetPerformanceState(h)),
        "energy": ("GetTotalEnergyConsumption", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        "replay": ("GetPcieReplayCounter", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
        "rows": ("GetRemappedRows", lambda: nv.nvmlDeviceGetRemappedRows(h)),
        "mem2": ("GetMemoryInfo_v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=NVML_MEMORY_V2)),
        "enc": ("GetEncoderUtilization", lambda: nv.nvmlDeviceGetEncoderUtilization(h)),
        "dec": ("GetDecoderUtilization", lambda: nv.nvmlDeviceGetDecoderUtilization(h)),
        "fields": (
            "GetFieldValues",
            lambda: nv.nvmlDeviceGetFieldValues(
                h,
                [
                    NVML_FI_DEV_MEMORY_TEMP,
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                ],
            ),
        ),
    }
    got = {k: field(call, f"{step}(GPU {index})") for k, (step, call) in calls.items()}
    rows, mem2, enc, dec, fields = got["rows"], got["mem2"], got["enc"], got["dec"], got["fields"]
    values: list[int | float | None] = (
        [field_value(fv) for fv in fields] if fields is not None else [None] * 3
    )
    reading = nvlink_reading(fields, values[1], values[2])
    limit, pstate, replay = got["limit"], got["pstate"], got["replay"]
    more = {
        "sm_clock_mhz": _num(got["sm"]),
        "mem_clock_mhz": _num(got["mem"]),
        "power_limit_w": limit / 1000.0 if isinstance(limit, int) else None,
        "pstate": pstate if isinstance(pstate, int) and pstate != NVML_PSTATE_UNKNOWN else None,
        "memory_temp_c": _num(values[0]),
        "energy_mj": _num(got["energy"]),
        "pcie_replay_count": replay if isinstance(replay, int) else None,
        "remapped_rows_correctable": rows[0] if rows is not None else None,
        "remapped_rows_uncorrectable": rows[1] if rows is not None else None,
        "remapped_rows_pending": bool(rows[2]) if rows is not None else None,
        "row_remap_failure": bool(rows[3]) if rows is not None else None,
        "nvlink_bandwidth_mib_s": nvlink_rate(previous, reading),
        "memory_reserved_mib": mib(mem2.reserved) if mem2 is not None else None,
        "encoder_util_pct": _num(enc[0]) if enc is not None else None,
        "decoder_util_pct": _num(dec[0]) if dec is not None else None,
    }
    return more, reading


def nvlink_reading(
    fields: Any, rx: int | float | None, tx: int | float | None
) -> NvlinkReading | None:
    """(rx + tx KiB, the newer of the two fields' timestamps); ``None`` without NVLink."""
    if fields is None or rx is None or tx is None:
        return None
    at = max(int(fields[1].timestamp), int(fields[2].timestamp)) or int(time.time() * 1e6)
    return int(rx) + int(tx), at


def nvlink_rate(previous: NvlinkReading | None, now: NvlinkReading | None) -> float | None:
    """NVLink rx + tx between two readings as DCGM computes DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL:
    KiB difference / seconds / 1000 (ReadAndCacheNvLinkBandwidth's "MiB/s"). ``None`` without
    a previous reading (DCGM publishes 0 there), without NVLink, or after a counter reset.

    >>> nvlink_rate((1_000, 0), (4_001_000, 2_000_000))
    2000.0
    >>> nvlink_rate(None, (5, 1)), nvlink_rate((9, 0), (5, 1))
    (None, None)
    """
    if previous is None or now is None or now[1] <= previous[1] or now[0] < previous[0]:
        return None
    return round((now[0] - previous[0]) / ((now[1] - previous[1]) / 1e6) / 1000.0, 3)


def field_value(fv: Any) -> int | float | None:
    """One ``nvmlFieldValue_t``'s value by its ``valueType`` (nvml.h), ``None`` when its own
    ``nvmlReturn`` is not success (a field the device lacks: the call itself succeeded)."""
    if fv.nvmlReturn != 0:
        return None
    kind = int(fv.valueType)
    names = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    value = getattr(fv.value, names[kind]) if kind in names else None
    return value if isinstance(value, (int, float)) else None


def _num(value: Any) -> float | None:
    """An NVML integer reading as a float; ``None`` for anything else (a missing reading).

    >>> _num(1980), _num(None), _num(True)
    (1980.0, None, None)
    """
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def mib(value: Any) -> float | None:
    """Bytes as MiB (one decimal); ``None`` for no reading or NVML's "not available" values.

    >>> mib(1048576 * 3), mib(None), mib(2**64 - 1)
    (3.0, None, None)
    """
    if not isinstance(value, int) or value < 0 or value >= 2**63:
        return None
    return round(value / 1048576.0, 1)
