"""``orch watch``'s GPU rows and process table, as nvitop draws them (pure: view -> rich Text).

Per GPU a row of bars coloured by load and an info line (name, bus id, P-state, clocks,
power over its cap); below, one row per GPU process (GPU, PID inside the container, user,
GPU memory, CPU %, command), grouped by GPU as nvitop's process panel groups them.

Thresholds and formats copied from nvitop v1.7.0 (github.com/XuehaiPan/nvitop):

- load colours: ``nvitop/tui/library/device.py`` ``Device.GPU_UTILIZATION_THRESHOLDS = (10, 75)``,
  ``MEMORY_UTILIZATION_THRESHOLDS = (10, 80)`` and ``loading_intensity_of`` (``>=`` the upper:
  heavy, red; ``>=`` the lower: moderate, yellow; else light, green; unknown: moderate);
  memory's load is the used fraction (``memory_loading_intensity`` of ``memory_percent``);
- sizes: ``nvitop/api/utils.py`` ``bytes2human`` (``0B``, ``12.34MiB``, ``123.4MiB``,
  ``12345MiB``, ``12.34GiB``, ``140.4GiB``), memory as ``used / total`` (``memory_usage``);
- power as ``612W / 700W`` (``nvitop/api/device.py`` ``power_status``), P-state ``P0``
  (``performance_state``);
- the process table's columns (``nvitop/tui/screens/main/panels/process.py``: ``GPU PID USER
  GPU-MEM ... %CPU ... COMMAND``; a user name longer than its column is cut with ``+``).

Beyond nvitop: a GPU busy with (nearly) no memory (seed 000's ghost GPU: the
``ghost-utilization`` limits of :class:`~orchestrator.config.limits.Limits`) has its row
highlighted, as does one that failed (``error``).
"""

from __future__ import annotations

from rich.text import Text

from orchestrator.config.limits import Limits
from orchestrator.views.watch_model import TargetView
from orchestrator.wire.model import GpuProcess, GpuSample

GPU_UTILIZATION_THRESHOLDS = (10.0, 75.0)
MEMORY_UTILIZATION_THRESHOLDS = (10.0, 80.0)
LOAD_STYLE = ("green", "yellow", "red")
"""Light, moderate and heavy load (nvitop's ``LoadingIntensity.color``)."""
ANOMALY_STYLE = "bold white on red"
USER_W = 10
WIDE = 150
"""From this width on a GPU's row carries its info (name, bus id, P-state, clocks) too."""
PID_W = 12

_KIB, _MIB = 1024, 1024**2
_UNITS = (("GiB", 1024**3), ("TiB", 1024**4), ("PiB", 1024**5))


def load_level(pct: float | None, thresholds: tuple[float, float]) -> int:
    """0 light, 1 moderate, 2 heavy (nvitop's ``loading_intensity_of``; unknown is moderate).

    >>> [load_level(p, GPU_UTILIZATION_THRESHOLDS) for p in (0, 9.9, 10, 74, 75, 100, None)]
    [0, 0, 1, 1, 2, 2, 1]
    """
    if pct is None:
        return 1
    if pct >= thresholds[1]:
        return 2
    return 1 if pct >= thresholds[0] else 0


def util_style(g: GpuSample) -> str:
    return LOAD_STYLE[load_level(g.utilization_pct, GPU_UTILIZATION_THRESHOLDS)]


def mem_pct(g: GpuSample) -> float | None:
    if g.memory_used_mib is None or not g.memory_total_mib:
        return None
    return 100.0 * g.memory_used_mib / g.memory_total_mib


def mem_style(g: GpuSample) -> str:
    return LOAD_STYLE[load_level(mem_pct(g), MEMORY_UTILIZATION_THRESHOLDS)]


def size_text(mib: float | None) -> str:
    """A size in MiB as nvitop's ``bytes2human`` prints its bytes (``N/A`` when unknown).

    >>> [size_text(m) for m in (0, 0.5, 12.345, 512, 4521, 118234, 143771, 2e6, None)]
    ['0B', '512KiB', '12.35MiB', '512.0MiB', '4521MiB', '115.5GiB', '140.4GiB', '1.91TiB', 'N/A']
    """
    if mib is None:
        return "N/A"
    b = round(mib * _MIB)
    if b < _KIB:
        return f"{b}B"
    if b < _MIB:
        return f"{round(b / _KIB)}KiB"
    if b < 100 * _MIB:
        return f"{round(b / _MIB, 2):.2f}MiB"
    if b < 1000 * _MIB:
        return f"{round(b / _MIB, 1):.1f}MiB"
    if b < 20 * 1024 * _MIB:
        return f"{round(b / _MIB)}MiB"
    for unit, size in _UNITS:
        if b < 100 * size:
            return f"{round(b / size, 2):.2f}{unit}"
        if b < 1000 * size or unit == "PiB":
            return f"{round(b / size, 1):.1f}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def is_anomalous(g: GpuSample, limits: Limits) -> bool:
    """Busy (``>= ghost_util_pct``) with at most ``ghost_mem_mib`` of memory: the ghost GPU.

    >>> is_anomalous(GpuSample(3, utilization_pct=100.0, memory_used_mib=0.0), Limits())
    True
    """
    return (
        g.error is None
        and g.utilization_pct is not None
        and g.memory_used_mib is not None
        and g.utilization_pct >= limits.ghost_util_pct
        and g.memory_used_mib <= limits.ghost_mem_mib
    )


def _bar(pct: float | None, width: int) -> str:
    """A horizontal bar ``width`` cells long (``?`` when unknown).

    >>> _bar(50.0, 10), _bar(None, 3)
    ('█████░░░░░', '???')
    """
    if pct is None:
        return "?" * width
    full = round(min(100.0, max(0.0, pct)) / 100.0 * width)
    return "█" * full + "░" * (width - full)


def _power(g: GpuSample) -> str | None:
    if g.power_w is None:
        return None
    cap = f" / {g.power_limit_w:.0f}W" if g.power_limit_w is not None else ""
    return f"{g.power_w:.0f}W{cap}"


def gpu_row(v: TargetView, g: GpuSample, width: int) -> Text:
    """One GPU: index, role, utilisation and memory bars coloured by load, temperature, power
    (over its cap); a ghost or failed GPU is marked ``!`` and its label highlighted."""
    bar_w = 10 if width < 100 else 20
    role = v.roles.get(g.index, "-")
    ghost = is_anomalous(g, v.container.limits)
    t = Text("! " if ghost or g.error else "  ", style="bold red")
    t.append(f"GPU {g.index:<2}", style=ANOMALY_STYLE if ghost or g.error else "bold")
    t.append(f" {role[:9]:<9} ")
    t.append(_bar(g.utilization_pct, bar_w), style=util_style(g))
    util = "?" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
    t.append(f" {util:>4}  ")
    t.append(_bar(mem_pct(g), bar_w), style=mem_style(g))
    t.append(f" {size_text(g.memory_used_mib)} / {size_text(g.memory_total_mib)}")
    if g.temperature_c is not None:
        t.append(f" {g.temperature_c:.0f}C")
    power = _power(g)
    if power is not None:
        t.append(f" {power if width >= 100 else power.replace(' / ', '/')}")
    if g.error:
        t.append(f" {g.error}", style="bold red")
    elif ghost:
        t.append(" busy, no memory", style="bold red")
    if width >= WIDE and info_text(g):
        t.append(f"  {info_text(g)}", style="dim")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def info_text(g: GpuSample) -> str:
    """The GPU's name, bus id, P-state and clocks, as far as NVML gave them.

    >>> info_text(GpuSample(0, name="NVIDIA H200", pci_bus_id="00000000:18:00.0", pstate=0,
    ...                     sm_clock_mhz=1980.0, mem_clock_mhz=2619.0))
    'NVIDIA H200  00000000:18:00.0  P0  SM 1980 MHz  MEM 2619 MHz'
    """
    parts = [g.name, g.pci_bus_id]
    if g.pstate is not None:
        parts.append(f"P{g.pstate}")
    if g.sm_clock_mhz is not None:
        parts.append(f"SM {g.sm_clock_mhz:.0f} MHz")
    if g.mem_clock_mhz is not None:
        parts.append(f"MEM {g.mem_clock_mhz:.0f} MHz")
    return "  ".join(p for p in parts if p)


def gpu_info(g: GpuSample, width: int) -> Text | None:
    """:func:`info_text` on a line of its own below the GPU's row; ``None`` when there is
    nothing to say or the row itself carries it (``width >= WIDE``)."""
    text = info_text(g)
    if not text or width >= WIDE:
        return None
    t = Text("         " + text, style="dim")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def pid_text(p: GpuProcess, v: TargetView) -> str:
    """The PID as this target knows it; another container's as ``ct201:17``, a host process's
    (or one NVML gave as a host PID) as ``host:4242``.

    >>> v = TargetView("ct200")
    >>> [pid_text(GpuProcess(9, vmid=200, container_pid=17, container="ct200"), v),
    ...  pid_text(GpuProcess(9, vmid=201, container_pid=5, container="ct201"), v),
    ...  pid_text(GpuProcess(17, container_pid=17), v), pid_text(GpuProcess(4242), v)]
    ['17', 'ct201:5', '17', 'host:4242']
    """
    inner = "?" if p.container_pid is None else str(p.container_pid)
    snap = v.shown
    own_vmid = snap.vmid if snap is not None else None
    if p.container == v.name or (p.vmid is not None and p.vmid == own_vmid):
        return inner
    if p.vmid is not None:
        return f"{p.container or f'CT{p.vmid}'}:{inner}"
    return inner if p.container_pid is not None else f"host:{p.pid}"


def _user(name: str | None) -> str:
    if not name:
        return "-"
    return name if len(name) <= USER_W else name[: USER_W - 1] + "+"


def process_header() -> Text:
    t = Text(
        f"  {'GPU':>3} {'PID':>{PID_W}} {'USER':<{USER_W}} {'GPU-MEM':>9} {'%CPU':>5}  COMMAND",
        style="bold reverse",
    )
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def process_rows(v: TargetView) -> list[Text]:
    """One row per process on the target's GPUs, by GPU then memory (largest first)."""
    snap = v.shown
    out = []
    for g in snap.gpus if snap is not None else ():
        for p in sorted(g.processes or (), key=lambda p: -(p.used_memory_mib or 0.0)):
            t = Text("  ")
            t.append(
                f"{g.index:>3}",
                style=mem_style(g) if not is_anomalous(g, v.container.limits) else ANOMALY_STYLE,
            )
            t.append(f" {pid_text(p, v)[-PID_W:]:>{PID_W}} {_user(p.user):<{USER_W}}")
            t.append(f" {size_text(p.used_memory_mib):>9}")
            cpu = "-" if p.cpu_pct is None else f"{p.cpu_pct:.1f}"
            t.append(f" {cpu:>5}  {p.command or p.name or '-'}")
            t.no_wrap, t.overflow = True, "ellipsis"
            out.append(t)
    return out


def process_table(v: TargetView, room: int) -> list[Text]:
    """The header and as many rows as ``room`` lines allow (a ``+N more`` row when cut);
    nothing when fewer than two lines are free or no GPU lists a process."""
    rows = process_rows(v)
    if room < 2 or not rows:
        return []
    if len(rows) + 1 > room:
        cut = len(rows) - (room - 2)
        rows = rows[: room - 2] + [
            Text(f"  +{cut} more processes (make the terminal taller)", style="dim")
        ]
    return [process_header(), *rows]


def plain_gpu_line(name: str, g: GpuSample, clock: str) -> str:
    """``--plain``'s line for one GPU (printed when its numbers changed).

    >>> g = GpuSample(3, utilization_pct=100.0, memory_used_mib=0.0, memory_total_mib=143771.0,
    ...               temperature_c=41.0, power_w=95.2, power_limit_w=700.0)
    >>> plain_gpu_line("ct200", g, "12:00:00")
    '12:00:00 ct200 gpu3 util=100% mem=0B/140.4GiB temp=41C power=95W/700W'
    """
    util = "-" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
    temp = "-" if g.temperature_c is None else f"{g.temperature_c:.0f}C"
    power = (_power(g) or "-").replace(" / ", "/")
    used, total = (
        size_text(m).replace("N/A", "-") for m in (g.memory_used_mib, g.memory_total_mib)
    )
    parts = [
        clock,
        name,
        f"gpu{g.index}",
        f"util={util}",
        f"mem={used}/{total}",
        f"temp={temp}",
        f"power={power}",
    ]
    if g.error:
        parts.append(f"error={g.error}")
    return " ".join(parts)
