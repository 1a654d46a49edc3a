"""The wire format shared by the operator side and the in-container agent.

Plain frozen dataclasses with ``to_dict``/``from_dict``. This module is copied
into the agent bundle, so it imports the standard library only. Every snapshot
carries ``schema_version``; a reader refuses a version newer than it knows
(:func:`check_schema`), because guessing at fields from the future would turn a
protocol problem into a wrong diagnosis.

Units live in field names (``memory_used_mib``, ``power_w``, ``taken_at`` is
Unix seconds). A reading that is missing is ``None``, never a magic number.

>>> g = GpuSample(index=3, uuid="GPU-3", name="H200", utilization_pct=100.0,
...               memory_used_mib=0.0, memory_total_mib=143771.0)
>>> GpuSample.from_dict(g.to_dict()) == g
True
>>> Severity.CRITICAL > Severity.WARNING
True
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator.wire.convert import AS_TEXT, READERS, SchemaError, dump, from_dict

SCHEMA_VERSION = 1

T = TypeVar("T")


class Severity(enum.IntEnum):
    """How bad a finding is; ``max()`` of several gives the worst."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


def _severity(value: Any, path: str) -> Severity:
    if isinstance(value, str):
        try:
            return Severity[value.upper()]
        except KeyError:
            raise SchemaError(f"{path}: unknown severity {value!r}") from None
    return Severity(int(value))


READERS[Severity] = _severity
AS_TEXT.add(Severity)


class Wire:
    """Mixin: ``to_dict`` gives JSON-native data; ``from_dict`` ignores unknown keys."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return dump(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls: type[T], data: Any) -> T:
        return from_dict(cls, data)


def check_schema(data: Any) -> None:
    """Refuse a document from a newer orch (or one without a version).

    >>> check_schema({"schema_version": 1})
    >>> check_schema({"schema_version": 99})
    Traceback (most recent call last):
    ...
    orchestrator.wire.convert.SchemaError: schema_version 99 is newer than this orch understands (1); upgrade orch
    """
    if not isinstance(data, dict):
        raise SchemaError(f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SchemaError(f"missing or bad schema_version: {version!r:.40}")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"schema_version {version} is newer than this orch understands "
            f"({SCHEMA_VERSION}); upgrade orch"
        )


# --- GPUs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuProcess(Wire):
    """A compute process holding a GPU, as NVML reports it: a host PID, or inside a container
    whose driver numbers by namespace (``NvmlStatus.pid_numbering``) its PID there.

    Read on the Proxmox host (or attributed with its probe), ``vmid`` is the container whose
    cgroup holds the process (``None``: a host process, or not known), ``container_pid`` its
    PID inside that container (``NSpid``) and ``container`` its name in hosts.yaml (when
    hosts.yaml names it). ``name`` is the process's ``comm``; inside a container the agent
    leaves it ``None``, since the host PID may be another process there.
    """

    pid: int
    used_memory_mib: float | None = None
    name: str | None = None
    vmid: int | None = None
    container_pid: int | None = None
    container: str | None = None
    user: str | None = None
    """The owner's user name as the container names it (its real uid mapped through the
    container's id map and looked up in its ``/etc/passwd``); the uid as digits when no entry
    names it."""
    cpu_pct: float | None = None
    """CPU % of one core since the previous observation (first: the average since its start)."""
    command: str | None = None
    """Its command line (``/proc/PID/cmdline``): arguments joined by spaces, secret-looking
    values masked, control characters shown, at most ``wire.text.MAX_COMMAND_CHARS``
    characters (``wire.text.command_line``)."""


@dataclass(frozen=True, slots=True)
class GpuSample(Wire):
    """One GPU at one instant.

    ``error`` is set (e.g. ``"gpu-lost"``) when this device failed while others
    answered; the readings are then ``None``.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] | None = None
    error: str | None = None
    pci_bus_id: str | None = None
    """NVML's bus id (``00000000:5D:00.0``): how a kernel line (Xid) names this GPU."""
    host_index: int | None = None
    """The GPU's NVML index on the Proxmox host, when read there (``index`` is the container's)."""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_limit_w: float | None = None
    pstate: int | None = None
    mem_copy_util_pct: float | None = None
    """Percent of the last sample period the memory was read or written (NVML's
    ``utilization.memory``, dcgm's MEM_COPY_UTIL)."""
    memory_temp_c: float | None = None
    """HBM temperature (NVML field ``NVML_FI_DEV_MEMORY_TEMP``); ``None`` where the board has no sensor."""
    energy_mj: float | None = None
    """Energy used since the driver was loaded, in millijoules (a counter)."""
    pcie_replay_count: int | None = None
    """PCIe retries since the driver was loaded (a counter)."""
    remapped_rows_correctable: int | None = None
    """Memory rows remapped for correctable errors (``nvmlDeviceGetRemappedRows``)."""
    remapped_rows_uncorrectable: int | None = None
    """Memory rows remapped for uncorrectable errors."""
    remapped_rows_pending: bool | None = None
    """A remapping waits for a GPU reset."""
    row_remap_failure: bool | None = None
    """A remapping failed (the GPU should be taken out of service)."""
    nvlink_bandwidth_mib_s: float | None = None
    """NVLink data received plus sent over all links since the collector's previous reading,
    in MiB/s as DCGM computes it (KiB/s / 1000); ``None`` on a first reading or without NVLink."""
    memory_reserved_mib: float | None = None
    """Framebuffer the driver reserves (``nvmlDeviceGetMemoryInfo_v2``)."""
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None


@dataclass(frozen=True, slots=True)
class NvmlStatus(Wire):
    """How the GPU readings were obtained, or why they could not be.

    ``source``: ``"nvml"`` (pynvml), ``"nvidia-smi"`` (fallback) or ``None``.
    ``error_kind``: ``library-not-found``, ``driver-not-loaded``, ``driver-mismatch``,
    ``gpu-lost``, ``timeout`` or ``other``; ``None`` when all went well.
    ``pid_numbering`` (read inside a container): ``"namespace"`` when the processes' PIDs are
    the container's own (drivers since 535.113.01; ``container_pid`` is then set), ``"host"``
    when they are host PIDs; ``None`` on the host (host PIDs) or when nothing told.
    """

    ok: bool
    source: str | None = None
    error_kind: str | None = None
    message: str | None = None
    driver_version: str | None = None
    elapsed_ms: float | None = None
    pid_numbering: str | None = None


@dataclass(frozen=True, slots=True)
class KernelEvent(Wire):
    """A kernel-log line that matters: ``kind`` is ``xid``, ``sxid`` (NVSwitch),
    ``fallen-off-bus``, ``oom-killer`` or ``link-down`` (``device``: the NIC or bridge port
    that went down: a multi-node job's network).

    ``vmid`` is the container it belongs to, when the host could tell (the OOM victim's
    ``task_memcg=/lxc/<vmid>/``, its cgroup, the container whose processes hold the GPU the
    line names); ``None``: a host-wide event. ``boot`` is ``0`` for the running boot and
    ``-1`` for the one before (the journal's numbering), ``None`` when not known. ``gpu`` is
    the host's NVML index of the GPU ``pci`` names, when known. ``vmid`` of a ``link-down``
    is the guest whose Proxmox port it names (agent/netlog.py), a VM's as well.
    """

    kind: str
    line: str
    at: float | None = None
    xid: int | None = None
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    vmid: int | None = None
    boot: int | None = None
    gpu: int | None = None
    memcg: str | None = None
    device: str | None = None
    gpu_instance: int | None = None
    """The MIG GPU instance an Xid names (``GPU-I:02``), ``None`` without MIG attribution."""
    compute_instance: int | None = None
    """The MIG compute instance an Xid names (``GPU-CI:01``), ``None`` when not named."""


# --- tmux, processes, run --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionState(Wire):
    """The run's tmux session. ``pane_dead_signal`` is set when a signal ended the pane."""

    name: str
    exists: bool
    server_running: bool = True
    pane_dead: bool | None = None
    pane_dead_status: int | None = None
    pane_dead_signal: int | None = None
    pane_pid: int | None = None
    pane_tail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessInfo(Wire):
    """One process of the run's tree, from /proc. ``cpu_pct`` is over the last interval."""

    pid: int
    ppid: int
    name: str
    state: str
    cpu_pct: float | None = None
    rss_mib: float | None = None
    threads: int | None = None
    zombie: bool = False
    host_pid: int | None = None
    """The same process's PID on the Proxmox host (read there; the kernel log names it)."""


CPU_RUN_ENV = "ORCH_TRAINER_DEVICE"
"""Set to ``cpu`` in a run's environment (and so its manifest) when ``orch launch`` starts the
bundled trainer with a config whose every stage is on the CPU: that run never allocates GPU
memory, and the not-allocating detector knows it."""


@dataclass(frozen=True, slots=True)
class RunManifest(Wire):
    """What was started, written to ``<run-dir>/manifest.json`` at launch.

    ``env`` holds only the variables orch set, secret-looking values masked.
    """

    run_id: str
    command: str
    workdir: str
    session: str
    started_at: float
    gpus: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    git_rev: str | None = None
    orch_version: str | None = None
    target: str | None = None
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class RunState(Wire):
    """The newest run directory as seen by the agent.

    ``new_log_lines`` are the complete lines appended since the previous snapshot
    (by byte offset ``log_offset``); the first snapshot returns at most the tail.
    """

    run_id: str
    run_dir: str
    manifest: RunManifest | None = None
    log_path: str | None = None
    log_exists: bool = False
    log_size_bytes: int | None = None
    log_mtime: float | None = None
    log_offset: int = 0
    new_log_lines: tuple[str, ...] = ()
    exit_status: int | None = None
    exit_status_at: float | None = None
    heartbeat_age_s: float | None = None
    log_error: str | None = None
    stop_requested_at: float | None = None
    """When ``orch stop`` asked this run to end (its ``stop_requested`` file; Unix s)."""
    stop_requested_by: str | None = None
    """Who asked (``orch stop by user@host``), from the same file."""
    disk_free_mib: float | None = None
    """Space available to the run on the file system holding its run dir (statvfs
    ``f_bavail``, MiB); ``None`` when unknown (old agent, statvfs failed)."""
    disk_total_mib: float | None = None
    """Size of that file system (MiB); ``None`` when unknown."""


@dataclass(frozen=True, slots=True)
class Metrics(Wire):
    """Training progress parsed from the newest log lines (``None`` when not seen).

    ``tokens_per_s`` is set only when the log prints tokens/s for the whole run (the bundled
    trainer, HF's ``train_tokens_per_second``); every rate is in ``throughput`` with its
    ``throughput_unit`` (``orchestrator.wire.progress_readers.UNITS``: ``tokens/s/device``,
    ``samples/s``, ``it/s``, ``s/step``...), never relabelled.
    """

    step: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    acc_len: float | None = None
    tau: float | None = None
    """Speculative-decoding acceptance length measured by real draft-and-verify (the bundled
    trainer's ``tau=``): drafts accepted per block plus the target's bonus token, >= 1."""
    seen_at: float | None = None
    total_steps: int | None = None
    """The step count the log prints beside the step (``iteration 300/500000``, tqdm's total)."""
    throughput: float | None = None
    """The newest training rate, in ``throughput_unit``."""
    throughput_unit: str | None = None
    eta_s: float | None = None
    """Seconds left, as printed (tqdm, mmengine, Keras) or from the steps left and the rate."""
    framework: str | None = None
    """The progress reader that read the log (``hf-trainer``, ``torchtitan``...; ``None``: the
    generic one)."""


@dataclass(frozen=True, slots=True)
class AgentCost(Wire):
    """What producing this snapshot cost inside the container."""

    cpu_ms: float
    bytes_read: int
    wall_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot(Wire):
    """Everything the agent saw in one observation of one container.

    ``taken_at`` is Unix seconds from the container's clock; detectors use it as
    their only clock. ``errors`` holds agent-side problems that are data, not
    crashes (e.g. ``"log deleted"``).
    """

    target: str
    taken_at: float
    schema_version: int = SCHEMA_VERSION
    session: SessionState | None = None
    run: RunState | None = None
    processes: tuple[ProcessInfo, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    nvml: NvmlStatus | None = None
    metrics: Metrics | None = None
    cost: AgentCost | None = None
    errors: tuple[str, ...] = ()
    reachable: bool = True
    container_status: str | None = None
    vmid: int | None = None
    """The container's vmid when the operator knows it (host-side events are matched by it)."""
    source: str | None = None
    """Where it was observed: ``host`` (the Proxmox host's observer), ``container`` (the agent
    inside), ``None`` (an older orch)."""
    kernel_events: tuple[KernelEvent, ...] = ()
    """Host kernel events attributed to this container (its cgroup, its GPU), oldest first."""

    @classmethod
    def unreachable(cls, target: str, at: float, reason: str) -> Snapshot:
        """The marker the operator records when the transport failed: no data, not a death."""
        return cls(target=target, taken_at=at, reachable=False, errors=(reason,))


# --- host side -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostProbe(Wire):
    """What the Proxmox host says about a container: ``pct status``, kernel log, GPU PIDs.

    ``gpu_pids`` maps a host PID holding a GPU to the vmid whose cgroup owns it
    (``None`` for a host process).
    """

    host: str
    taken_at: float
    container_status: dict[int, str] = field(default_factory=dict)
    kernel_events: tuple[KernelEvent, ...] = ()
    gpu_pids: dict[str, int | None] = field(default_factory=dict)
    kernel_log_source: str | None = None
    errors: tuple[str, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    """Every GPU process of the host: host PID, its container's vmid, PID inside and name."""


@dataclass(frozen=True, slots=True)
class HostDocument(Wire):
    """One observation of a Proxmox host by its observer (``agent host-observe`` / ``host-stream``,
    run on the host, not in a container): every container of the host that hosts.yaml names.

    ``gpus`` are the host's GPUs, each process mapped to its container (``GpuProcess.vmid``,
    ``container_pid``, ``container``). ``containers`` holds one snapshot per container name,
    read from the host (``source`` ``host``; its ``gpus`` empty: ``visible_gpus`` lists the host
    indices of the GPUs it sees, and the operator fills them in). ``kernel_events`` are the
    kernel lines new since the previous document (or since ``--since``), each with its
    owner's ``vmid`` when known; ``kernel_cursor`` is where the next read continues.
    ``container_status`` is pct's word per vmid (``running``, ``stopped``, ``missing``).
    """

    host: str
    taken_at: float
    schema_version: int = SCHEMA_VERSION
    gpus: tuple[GpuSample, ...] = ()
    nvml: NvmlStatus | None = None
    containers: dict[str, Snapshot] = field(default_factory=dict)
    visible_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    container_status: dict[int, str] = field(default_factory=dict)
    kernel_events: tuple[KernelEvent, ...] = ()
    kernel_log_source: str | None = None
    kernel_cursor: str | None = None
    errors: tuple[str, ...] = ()
    cost: AgentCost | None = None


# --- judgement -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding(Wire):
    """One thing a detector concluded about a target.

    ``kind`` is a stable kebab-case name (``ghost-utilization``) shared by the CLI
    filter, the Prometheus label, the playbook id and the test-case folders.
    ``since`` is the ``taken_at`` of the first sample that showed it. ``exit_status`` and
    ``signal`` (``SIGKILL``) are set on a run's end (``crashed``, ``finished``) for code to
    read: the summary and evidence are for people.
    """

    kind: str
    severity: Severity
    target: str
    summary: str
    gpus: tuple[int, ...] = ()
    since: float | None = None
    evidence: tuple[str, ...] = ()
    playbook: str | None = None
    exit_status: int | None = None
    signal: str | None = None

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        """Identity for deduplicating alerts: the same kind on the same GPUs."""
        return (self.target, self.kind, self.gpus)
