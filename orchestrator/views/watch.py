"""``orch watch``'s rendering (pure: model + clock + size -> renderable or text line).

:func:`render_dashboard` (every target), :func:`render_detail` (one target: GPUs, evidence,
pane tail) and :func:`plain_line` (``--plain``). The model they draw is
:mod:`orchestrator.views.watch_model`; the terminal, the keys and the loop are
:mod:`orchestrator.views.watch_loop`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from orchestrator.monitor.hostpath import HostView
from orchestrator.monitor.jobs import JobJudgement
from orchestrator.monitor.journal import summary
from orchestrator.views.progress import format_eta, rate_text, step_text
from orchestrator.views.watch_gpus import (
    ANOMALY_STYLE,
    gpu_info,
    gpu_row,
    is_anomalous,
    mem_style,
    plain_gpu_line,
    process_table,
    util_style,
)
from orchestrator.views.watch_model import TargetView, WatchModel
from orchestrator.wire.model import Finding, GpuSample, Severity
from orchestrator.wire.text import visible

log = logging.getLogger(__name__)

SPARK = "▁▂▃▄▅▆▇█"
BADGE_STYLE = {
    "connecting": "dim",
    "unreachable": "bold magenta",
    "stopped": "bold red",
    "idle": "dim",
    "starting": "cyan",
    "running": "bold green",
    "stalled": "bold yellow",
    "finished": "blue",
    "crashed": "bold red",
    "dead": "bold white on red",
}
SEVERITY_STYLE = {
    Severity.INFO: "blue",
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
}
HIDDEN_KINDS = frozenset({"unreachable"})  # the badge already says it


# --- pure rendering ------------------------------------------------------------------------


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their maximum.

    >>> sparkline([0, 5, 10], 3)
    '▁▅█'
    >>> sparkline([], 4)
    ''
    """
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    if top <= 0:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, round(v / top * (len(SPARK) - 1)))] for v in vals)


def level(fraction: float | None) -> str:
    """One block character for a 0..1 fraction (``?`` when unknown).

    >>> level(0.0), level(1.0), level(None)
    ('▁', '█', '?')
    """
    if fraction is None:
        return "?"
    f = min(1.0, max(0.0, fraction))
    return SPARK[round(f * (len(SPARK) - 1))]


def human(value: float | None) -> str:
    """Short number: ``21.5k``, ``950``, ``-`` when unknown.

    >>> human(21500.0), human(950.0), human(None)
    ('21.5k', '950', '-')
    """
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def duration(seconds: float | None) -> str:
    """``42s``, ``12m``, ``3h05m``, ``2d04h``.

    >>> duration(42), duration(720), duration(11100), duration(187200)
    ('42s', '12m', '3h05m', '2d04h')
    """
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(ts: float) -> str:
    """Local ``HH:MM:SS`` of Unix seconds."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def state_text(v: TargetView) -> str:
    """The badge's words: ``unreachable since HH:MM:SS`` for a lost connection."""
    if v.state == "unreachable" and v.unreachable_since is not None:
        return f"unreachable since {clock(v.unreachable_since)}"
    return v.state


def _mem_fraction(g: GpuSample) -> float | None:
    if g.memory_used_mib is None or not g.memory_total_mib:
        return None
    return g.memory_used_mib / g.memory_total_mib


def _util_fraction(g: GpuSample) -> float | None:
    return None if g.utilization_pct is None else g.utilization_pct / 100.0


def _load_style(v: TargetView, g: GpuSample, style: str) -> str:
    """A GPU's level character: coloured by load, the ghost GPU highlighted."""
    return ANOMALY_STYLE if is_anomalous(g, v.container.limits) else style


def _visible_findings(v: TargetView) -> list[Finding]:
    return sorted(
        (f for f in v.findings if f.kind not in HIDDEN_KINDS),
        key=lambda f: (-f.severity, f.kind),
    )


def _finding_line(f: Finding, titles: Mapping[str, str], indent: str) -> Text:
    t = Text(indent)
    t.append(f"{str(f.severity).upper():8}", style=SEVERITY_STYLE.get(f.severity, ""))
    t.append(f" {f.kind}")
    if f.gpus:
        t.append(f" GPU {','.join(map(str, f.gpus))}")
    title = titles.get(f.playbook or "", f.playbook or "")
    t.append(f" - {title or f.summary}", style="italic")
    return t


def target_lines(
    v: TargetView,
    *,
    now: float,
    width: int,
    titles: Mapping[str, str],
    selected: bool = False,
    max_findings: int = 2,
    rank: int | None = None,
) -> list[Text]:
    """The dashboard row of one target: a status line, a GPU line, its findings (a job's node:
    indented, with its rank)."""
    label = v.name if rank is None else f"  {v.name} r{rank}"
    name_w = max(6, min(14, len(label)))
    head = Text("▶ " if selected else "  ", style="bold")
    head.append(f"{label[:name_w]:<{name_w}} ", style="bold")
    head.append(f" {state_text(v)} ", style=BADGE_STYLE.get(v.state, ""))
    snap = v.shown
    run = snap.run if snap is not None else None
    if run is not None:
        head.append(f" {run.run_id}")
        started = run.manifest.started_at if run.manifest is not None else None
        if started is not None and snap is not None:
            head.append(f" {duration(snap.taken_at - started)}", style="dim")
    m = snap.metrics if snap is not None else None
    if m is not None and m.step is not None:
        head.append(f"  {step_text(m)}")
    if v.rates and v.rate_unit is not None:
        head.append(f"  {rate_text(v.rates[-1], v.rate_unit)} ")
        head.append(sparkline(v.rates, 12), style="green")
    if m is not None and m.tau is not None:  # acceptance length of real draft-and-verify
        head.append(f"  τ {m.tau:.2f}")
    head.no_wrap, head.overflow = True, "ellipsis"
    out = [head]

    if snap is not None and snap.gpus:
        gl = Text("    util ", style="dim")
        for g in snap.gpus:
            gl.append(level(_util_fraction(g)), style=_load_style(v, g, util_style(g)))
        gl.append("  mem ", style="dim")
        for g in snap.gpus:
            gl.append(level(_mem_fraction(g)), style=_load_style(v, g, mem_style(g)))
        if width >= 100:
            used = sum(g.memory_used_mib or 0 for g in snap.gpus)
            gl.append(f"  {used / 1024:.0f} GiB used", style="dim")
        if v.state == "unreachable":
            gl.append("  (stale)", style="dim")
        gl.no_wrap, gl.overflow = True, "ellipsis"
        out.append(gl)
    elif snap is not None and snap.nvml is not None and not snap.nvml.ok:
        out.append(Text(f"    NVML: {snap.nvml.error_kind or snap.nvml.message}", style="yellow"))

    shown = _visible_findings(v)
    for f in shown[:max_findings]:
        line = _finding_line(f, titles, "    ")
        line.no_wrap, line.overflow = True, "ellipsis"
        out.append(line)
    if len(shown) > max_findings:
        out.append(Text(f"    +{len(shown) - max_findings} more (Enter for detail)", style="dim"))
    heal = heal_text(v, now)
    if heal and max_findings:
        line = Text(f"    heal: {heal}", style="cyan")
        line.no_wrap, line.overflow = True, "ellipsis"
        out.append(line)
    return out


def heal_text(v: TargetView, now: float, *, short: bool = False) -> str | None:
    """The restart journal's word on this target (``orch supervise``), or ``None``.

    >>> from orchestrator.monitor.journal import JournalEntry
    >>> v = TargetView("ct", journal=(JournalEntry("ct", 0.0, "give-up", "module-not-found: not retryable", run_id="r1"),))
    >>> heal_text(v, 30.0)
    'give-up r1 30s ago: module-not-found: not retryable'
    """
    if not v.journal:
        return None
    policy = v.container.restart
    s = summary(
        v.journal,
        now=now,
        max_restarts=policy.max_restarts if policy else None,
        window_s=policy.window_s if policy else None,
    )
    return None if s is None else str(s["short" if short else "text"])


def job_lines(jj: JobJudgement, *, width: int) -> list[Text]:
    """A job's row: its name, state (its worst node's), nodes, total tokens/s, and its own
    finding (the first failure) on a second line."""
    head = Text("  ")
    head.append(f"{jj.name} ", style="bold underline")
    head.append(f" {jj.state} ", style=BADGE_STYLE.get(jj.state, ""))
    head.append(f"  job of {len(jj.nodes)} nodes", style="dim")
    if jj.tokens_per_s is not None:
        head.append(f"  {human(jj.tokens_per_s)} tok/s total")
    head.no_wrap, head.overflow = True, "ellipsis"
    out = [head]
    for f in jj.findings:
        t = Text("    ")
        t.append(f"{str(f.severity).upper():8}", style=SEVERITY_STYLE.get(f.severity, ""))
        t.append(f" {f.summary}", style="italic")
        t.no_wrap, t.overflow = True, "ellipsis"
        out.append(t)
    del width
    return out


def job_plain_line(jj: JobJudgement, *, now: float) -> str:
    """A job's line for ``--plain``.

    >>> from orchestrator.monitor.jobs import JobJudgement
    >>> job_plain_line(JobJudgement("pair", "running", ()), now=0.0)[9:]
    'pair job running nodes=0'
    """
    parts = [clock(now), jj.name, "job", jj.state, f"nodes={len(jj.nodes)}"]
    if jj.tokens_per_s is not None:
        parts.append(f"tok/s={human(jj.tokens_per_s)}")
    parts += [f"{f.severity.name}:{f.kind}({f.summary})" for f in jj.findings]
    return visible(" ".join(parts))


def _header(title: str, now: float, hint: str) -> Text:
    t = Text(f"orch watch  {title}  {clock(now)}", style="bold reverse")
    t.append(f"  {hint}", style="reverse")
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def render_dashboard(
    model: WatchModel,
    *,
    now: float,
    width: int = 80,
    height: int = 24,
    selected: int = 0,
    titles: Mapping[str, str] | None = None,
) -> RenderableType:
    """Every target, fitted into ``width`` x ``height`` (a ``+N more`` line when it does not fit)."""
    titles = titles or {}
    views = list(model.views.values())
    n = len(views)
    lines: list[Text] = [
        _header(f"{n} target{'s' if n != 1 else ''}", now, "q quit  ↑↓ select  ⏎ detail"),
        Text(""),
    ]
    hosts = host_lines(model, titles)
    lines.extend(hosts)
    budget = max(3, height - len(lines) - 1 - len(model.messages))
    used = 0
    jobs = model.job_rows()
    heads: dict[str, list[Text]] = {}
    for jj in jobs:  # a job's row goes above its first node, its nodes indented under it
        heads[jj.nodes[0].node.container if jj.nodes else ""] = job_lines(jj, width=width)
    ranks = {r.node.container: r.node.rank for jj in jobs for r in jj.nodes}
    order = [v for jj in jobs for r in jj.nodes for v in views if v.name == r.node.container]
    views = order + [v for v in views if v.name not in ranks]
    for i, v in enumerate(views):
        block = target_lines(
            v, now=now, width=width, titles=titles, selected=i == selected, rank=ranks.get(v.name)
        )
        block = heads.get(v.name, []) + block
        if used + len(block) > budget and i > 0:
            lines.append(Text(f"  +{n - i} more targets (make the terminal taller)", style="dim"))
            break
        lines.extend(block[: max(1, budget - used)])
        used += len(block)
    lines.extend(Text(m, style="dim yellow") for m in model.messages)
    return Group(*_shown(lines))


def render_detail(
    v: TargetView,
    *,
    now: float,
    width: int = 80,
    height: int = 24,
    titles: Mapping[str, str] | None = None,
    messages: Sequence[str] = (),
) -> RenderableType:
    """One target: its row, one line per GPU (bars coloured by load), each GPU's name, bus id,
    P-state and clocks, the processes on its GPUs, findings with evidence, and the pane or log
    tail, fitted into ``height``: the GPU rows and findings first, then the process table,
    the GPU info lines and the tail (at least two lines of it when there is one)."""
    titles = titles or {}
    lines: list[Text] = [_header(v.name, now, "q quit  esc back"), Text("")]
    lines.extend(target_lines(v, now=now, width=width, titles=titles, max_findings=0)[:1])
    snap = v.shown
    gpus = list(snap.gpus) if snap is not None else []
    later: list[Text] = []
    for f in _visible_findings(v):
        later.append(_finding_line(f, titles, "  "))
        summary = Text(f"      {f.summary}")
        summary.no_wrap, summary.overflow = True, "ellipsis"
        later.append(summary)
        for ev in f.evidence[:4]:
            e = Text(f"      > {ev}", style="dim")
            e.no_wrap, e.overflow = True, "ellipsis"
            later.append(e)
    for entry in v.journal[-4:]:
        jl = Text(f"  heal: {entry.line(now)}", style="cyan")
        jl.no_wrap, jl.overflow = True, "ellipsis"
        later.append(jl)
    tail = _tail(v)
    keep = min(3, len(tail) + 1) if tail else 0  # the tail's header and two of its lines
    free = height - 1 - len(lines) - len(gpus) - len(later) - len(messages) - keep
    procs = process_table(v, free)
    free -= len(procs)
    infos = [gpu_info(g, width) for g in gpus]
    with_info = free >= sum(i is not None for i in infos)
    for g, info in zip(gpus, infos, strict=True):
        lines.append(gpu_row(v, g, width))
        if with_info and info is not None:
            lines.append(info)
    lines.extend(procs)
    lines.extend(later)
    room = height - len(lines) - 1 - len(messages)
    if tail and room > 1:
        lines.append(Text("  --- pane / log tail ---", style="dim"))
        for raw in tail[-(room - 1) :]:
            t = Text(f"  {raw}")
            t.no_wrap, t.overflow = True, "ellipsis"
            lines.append(t)
    lines.extend(Text(m, style="dim yellow") for m in messages)
    return Group(*_shown(lines[: max(1, height)]))


def plain_gpu_lines(v: TargetView, *, now: float) -> list[str]:
    """``--plain``'s lines for the GPUs whose numbers changed with the last snapshot
    (``v.gpu_changes``): ``HH:MM:SS ct200 gpu3 util=100% mem=0B/140.4GiB temp=41C power=95W/700W``.

    >>> from orchestrator.wire.model import GpuSample
    >>> v = TargetView("ct200", gpu_changes=(GpuSample(0, utilization_pct=98.0),))
    >>> plain_gpu_lines(v, now=0.0)[0][9:]
    'ct200 gpu0 util=98% mem=-/- temp=- power=-'
    """
    return [visible(plain_gpu_line(v.name, g, clock(now))) for g in v.gpu_changes]


def _shown(lines: list[Text]) -> list[Text]:
    """``lines`` with every control character and bidi override of the containers' text
    (run ids, process names, log lines) made visible, one character for one (the styles'
    spans stay put)."""
    for t in lines:
        plain = t.plain
        safe = visible(plain, same_length=True)
        if safe != plain:
            t.plain = safe
    return lines


def host_lines(model: WatchModel, titles: Mapping[str, str]) -> list[Text]:
    """One line per finding of a host's own (a kernel event no container owns)."""
    out = []
    for host, hv in sorted(model.hosts.items()):
        for f in sorted(hv.findings, key=lambda f: (-f.severity, f.kind)):
            line = _finding_line(f, titles, f"  host {host} ")
            line.no_wrap, line.overflow = True, "ellipsis"
            out.append(line)
    return out


def plain_host_line(hv: HostView, *, now: float, titles: Mapping[str, str] | None = None) -> str:
    """``--plain``'s line for a host's own findings.

    >>> from orchestrator.wire.model import Finding, Severity
    >>> f = Finding("xid", Severity.CRITICAL, "host:pve1", "Xid 79", playbook="gpu-fallen-off-bus")
    >>> plain_host_line(HostView("pve1", findings=(f,)), now=0.0)[9:]
    'host:pve1 CRITICAL:xid Xid 79'
    """
    titles = titles or {}
    parts = [clock(now), f"host:{hv.host}"]
    for f in sorted(hv.findings, key=lambda f: (-f.severity, f.kind)):
        parts.append(f"{f.severity.name}:{f.kind} {f.summary}")
    if not hv.findings:
        parts.append("ok")
    return visible(" ".join(parts))


def _tail(v: TargetView) -> list[str]:
    snap = v.shown
    if snap is not None and snap.session is not None and snap.session.pane_tail:
        return [line for line in snap.session.pane_tail if line.strip()] or list(v.log_tail)
    return list(v.log_tail)


def plain_line(v: TargetView, *, now: float, titles: Mapping[str, str] | None = None) -> str:
    """One line for ``--plain`` (and non-TTY output).

    >>> v = TargetView("ct200", state="crashed", run_id="r1")
    >>> plain_line(v, now=0.0)[9:]
    'ct200 crashed run=r1'
    """
    titles = titles or {}
    parts = [clock(now), v.name, state_text(v)]
    if v.run_id:
        parts.append(f"run={v.run_id}")
    snap = v.shown
    m = snap.metrics if snap is not None else None
    if m is not None and m.step is not None:
        total = f"/{m.total_steps}" if m.total_steps is not None else ""
        parts.append(f"step={m.step}{total}")
        if m.eta_s is not None:
            parts.append(f"eta={format_eta(m.eta_s)}")
    if v.rates and v.rate_unit is not None:
        key = "tok/s" if v.rate_unit == "tokens/s" else v.rate_unit
        parts.append(f"{key}={human(v.rates[-1])}")
    if m is not None and m.tau is not None:
        parts.append(f"tau={m.tau:.2f}")
    for f in _visible_findings(v):
        gpus = f"[GPU {','.join(map(str, f.gpus))}]" if f.gpus else ""
        title = titles.get(f.playbook or "", "")
        parts.append(f"{f.severity.name}:{f.kind}{gpus}" + (f"({title})" if title else ""))
    if v.journal:
        last = v.journal[-1]
        parts.append(f"heal={last.action}" + (f"({last.new_run_id})" if last.new_run_id else ""))
    return visible(" ".join(parts))
