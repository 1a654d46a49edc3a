"""watch's GPU rows and process table (views/watch_gpus.py), rendered from hand-built wire
objects: nvitop's columns, load colours and sizes, the ghost GPU highlighted, the fit into
80x24, hostile process text, and ``--plain``'s GPU lines (views/watch_model.gpu_key)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.config.inventory import ContainerConfig
from orchestrator.views import watch as w
from orchestrator.views import watch_gpus as wg
from orchestrator.views import watch_model
from orchestrator.wire.model import GpuProcess, GpuSample, Snapshot
from tests.views.snapshots import TOTAL_MIB, gpus, running
from tests.views.test_watch_render import render

CFG = ContainerConfig(
    name="ct200", host="sandbox", gpus={"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
)
TRAINER = "python3 -m trainer --config cfg.yaml"


def trainer(i: int, **kw) -> GpuProcess:
    return GpuProcess(
        412301 + i,
        used_memory_mib=117712.0,
        name="python3",
        vmid=200,
        container_pid=17 + i,
        container="ct200",
        user="root",
        cpu_pct=101.3,
        command=TRAINER,
        **kw,
    )


def devices(util: dict[int, float], mem: dict[int, float], procs=None) -> tuple[GpuSample, ...]:
    """Eight H200s with the device fields NVML gives (clocks, cap, P-state), GPU 3 the ghost."""
    out = []
    for g in gpus(util, mem):
        i = g.index
        out.append(
            dataclasses.replace(
                g,
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                sm_clock_mhz=1980.0 - i,
                mem_clock_mhz=2619.0,
                power_limit_w=700.0,
                pstate=0,
                power_w=612.4,
                processes=(procs or {}).get(i, (trainer(i),)) if i != 3 else (),
            )
        )
    return tuple(out)


BUSY = {i: 98.0 for i in range(8)} | {3: 100.0, 6: 40.0}
FULL = {i: 118234.0 for i in range(8)} | {3: 0.0, 6: 9000.0}


def view(snap: Snapshot) -> watch_model.TargetView:
    m = watch_model.WatchModel(
        [watch_model.TargetView("ct200", roles=CFG.roles_by_gpu, config=CFG)]
    )
    m.apply("ct200", snap)
    return m.views["ct200"]


def test_detail_lists_each_gpus_processes_and_device_fields():
    v = view(running("ct200", gpus=devices(BUSY, FULL), vmid=200))
    text = "\n".join(render(w.render_detail(v, now=1000.0, width=120, height=40), 120, 40))
    header = next(line for line in text.splitlines() if "COMMAND" in line)
    assert header.split() == ["GPU", "PID", "USER", "GPU-MEM", "%CPU", "COMMAND"]
    row0 = next(line for line in text.splitlines() if re.match(r"\s+0\s+17\s", line))
    assert row0.split()[:5] == ["0", "17", "root", "115.0GiB", "101.3"]  # PID inside, not 412301
    assert row0.endswith(TRAINER)
    assert "412301" not in text
    assert "NVIDIA H200  00000000:18:00.0  P0  SM 1980 MHz  MEM 2619 MHz" in text
    assert "612W / 700W" in text
    # memory as nvitop prints it, never "0.0/140G"
    assert (
        "115.5GiB / 140.4GiB" in text and "0B / 140.4GiB" in text and "9000MiB / 140.4GiB" in text
    )
    assert "0.0/140G" not in text


def test_other_containers_and_host_processes_are_named_as_such():
    procs = {
        0: (
            trainer(0),
            GpuProcess(
                4242,
                used_memory_mib=512.0,
                vmid=201,
                container_pid=5,
                container="ct201",
                user="trainee",
                command="sleep 600",
            ),
        ),
        1: (GpuProcess(99, used_memory_mib=20.0),),
    }
    v = view(running("ct200", gpus=devices(BUSY, FULL, procs), vmid=200))
    rows = [line for line in render(w.render_detail(v, now=1000.0, width=120, height=40), 120, 40)]
    other = next(line for line in rows if "ct201:5" in line)
    assert other.split()[:4] == ["0", "ct201:5", "trainee", "512.0MiB"] and other.endswith(
        "sleep 600"
    )
    host = next(line for line in rows if "host:99" in line)
    assert host.split() == ["1", "host:99", "-", "20.00MiB", "-", "-"]  # nothing read of it


@pytest.mark.parametrize(
    ("pct", "kind", "style"),
    [
        (9.9, "gpu", "green"),
        (10.0, "gpu", "yellow"),
        (74.9, "gpu", "yellow"),
        (75.0, "gpu", "red"),
        (79.9, "memory", "yellow"),
        (80.0, "memory", "red"),
        (None, "gpu", "yellow"),
    ],
)
def test_load_colours_are_nvitops_thresholds(pct, kind, style):
    """nvitop v1.7.0 tui/library/device.py: GPU (10, 75), memory (10, 80), N/A is moderate."""
    thresholds = (
        wg.GPU_UTILIZATION_THRESHOLDS if kind == "gpu" else wg.MEMORY_UTILIZATION_THRESHOLDS
    )
    assert wg.LOAD_STYLE[wg.load_level(pct, thresholds)] == style


def _styles(t) -> dict[str, str]:
    """Each styled stretch of a rendered row: its text -> its style."""
    return {t.plain[s.start : s.end]: str(s.style) for s in t.spans}


def test_bars_are_coloured_by_load_and_the_ghost_row_is_highlighted():
    v = view(running("ct200", gpus=devices(BUSY, FULL), vmid=200))
    snap = v.shown
    busy = _styles(wg.gpu_row(v, snap.gpus[0], 120))
    assert busy["█" * 20] == "red"  # 98 % utilisation: heavy
    assert busy["█" * 16 + "░" * 4] == "red"  # 82 % of the memory: heavy
    light = _styles(wg.gpu_row(v, snap.gpus[6], 120))
    assert light["█" * 8 + "░" * 12] == "yellow" and light["█" + "░" * 19] == "green"
    ghost = wg.gpu_row(v, snap.gpus[3], 120)
    assert ghost.plain.startswith("! GPU 3") and ghost.plain.endswith("busy, no memory")
    assert _styles(ghost)["GPU 3 "] == wg.ANOMALY_STYLE
    assert _styles(wg.gpu_row(v, snap.gpus[0], 120))["GPU 0 "] == "bold"
    dash = w.target_lines(v, now=1000.0, width=80, titles={})[1]
    ghost_cells = [str(s.style) for s in dash.spans if dash.plain[s.start : s.end] in "▁▂▃▄▅▆▇█?"]
    assert ghost_cells.count(wg.ANOMALY_STYLE) == 2  # GPU 3's util and mem levels


def test_detail_fits_80x24_with_processes_cut_and_the_tail_kept():
    many = {i: (trainer(i), trainer(i), trainer(i)) for i in range(8)}
    v = view(running("ct200", gpus=devices(BUSY, FULL, many), vmid=200))
    lines = render(w.render_detail(v, now=1000.0, width=80, height=24), 80, 24)
    text = "\n".join(lines)
    assert len(lines) <= 23 and max(map(len, lines)) <= 80
    assert "GPU 0  target" in text and "GPU 7  drafter" in text  # every GPU row
    assert re.search(r"\+\d+ more processes", text)
    assert "step 120 loss 2.1" in text  # the tail keeps its lines
    assert "SM 1980 MHz" not in text  # the info lines are what gives way first


def test_unknown_readings_render_as_unknown():
    bare = tuple(GpuSample(index=i) for i in range(2))
    v = view(running("ct200", gpus=bare))
    text = "\n".join(render(w.render_detail(v, now=1000.0, width=120, height=40), 120, 40))
    assert "GPU 0" in text and "N/A / N/A" in text and "?" in text
    assert "COMMAND" not in text and "MHz" not in text


def test_hostile_process_text_reaches_the_screen_as_visible_characters():
    evil = dataclasses.replace(
        trainer(0), user="r\x1b[2J", command="x\x1b]0;pwned\x07 \u202eevil \x9b31m"
    )
    v = view(running("ct200", gpus=devices(BUSY, FULL, {0: (evil,)}), vmid=200))
    out = "\n".join(render(w.render_detail(v, now=1000.0, width=120, height=40), 120, 40))
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    assert "x␛]0;pwned" in out and "r␛[2J" in out  # (rich itself drops a BEL)


def test_plain_prints_a_line_per_gpu_whose_numbers_changed():
    m = watch_model.WatchModel(
        [watch_model.TargetView("ct200", roles=CFG.roles_by_gpu, config=CFG)]
    )
    v = m.views["ct200"]
    m.apply("ct200", running("ct200", gpus=devices(BUSY, FULL)))
    assert len(w.plain_gpu_lines(v, now=0.0)) == 8  # the first snapshot: every GPU
    m.apply("ct200", running("ct200", step=121, gpus=devices(BUSY, FULL)))
    assert w.plain_gpu_lines(v, now=0.0) == []  # nothing changed
    m.apply("ct200", running("ct200", step=122, gpus=devices(BUSY | {6: 55.0}, FULL)))
    (line,) = w.plain_gpu_lines(v, now=0.0)
    # parsed as plain_gpu_line's f-strings print it (views/watch_gpus.py)
    got = re.fullmatch(
        r"\d\d:\d\d:\d\d (\S+) gpu(\d+) util=(\S+) mem=(\S+)/(\S+) temp=(\S+) power=(\S+)", line
    )
    assert got is not None, line
    assert got.groups() == ("ct200", "6", "55%", "9000MiB", "140.4GiB", "40C", "612W/700W")
    m.apply("ct200", Snapshot.unreachable("ct200", 1003.0, "refused"))
    assert w.plain_gpu_lines(v, now=0.0) == []
    assert w.plain_line(v, now=0.0)[9:].startswith(
        "ct200 unreachable"
    )  # the target's line as before


def test_size_text_matches_nvitops_bytes2human():
    """nvitop v1.7.0 api/utils.py bytes2human, fed MiB (NVML's memory in bytes / 2**20)."""
    assert [wg.size_text(m) for m in (0.0, 99.99, 100.0, 999.0, 20479.0, 20480.0, TOTAL_MIB)] == [
        "0B",
        "99.99MiB",
        "100.0MiB",
        "999.0MiB",
        "20479MiB",
        "20.00GiB",
        "140.4GiB",
    ]


def test_a_wide_terminal_puts_each_gpus_info_on_its_row():
    v = view(running("ct200", gpus=devices(BUSY, FULL), vmid=200))
    lines = render(w.render_detail(v, now=1000.0, width=200, height=24), 200, 24)
    row = next(line for line in lines if "GPU 0 " in line)
    assert row.endswith("612W / 700W  NVIDIA H200  00000000:18:00.0  P0  SM 1980 MHz  MEM 2619 MHz")
    assert sum("SM 19" in line for line in lines) == 8  # every GPU's, no line of their own
