"""The fields dcgm-exporter enables by default: the uncommented lines of its
etc/default-counters.csv at tag 4.5.3-4.8.2 (NVIDIA/dcgm-exporter; unchanged at d5e5f51), in
the file's order, and which of them NVML cannot give."""

from __future__ import annotations

DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)
"""The file's ``label`` fields: a label on every series, not a series."""
NOT_FROM_NVML = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "a vGPU guest's licence state",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM's profiling module",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM's profiling module",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM's profiling module",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "DCGM's profiling module",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "DCGM's profiling module",
}
FROM_NVML = tuple(n for n in DEFAULT_COUNTERS if n not in NOT_FROM_NVML)
GPU_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "container",
    "DCGM_FI_DRIVER_VERSION",
}
"""dcgm-exporter's labels (render_metrics.go, gpuMetricsFormat, with its container label and
the label field), what a Prometheus scrape adds (job, instance) aside."""
