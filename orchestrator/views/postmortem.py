"""Render a postmortem: the verdict on the terminal (rich), and the bundle's report.md / report.html.

``orchestrator.postmortem.collect.write_bundle`` writes :func:`markdown` and :func:`html`
(self-contained HTML, inline SVG timeline of per-GPU utilization and memory and
tokens/s, the death marked).
"""

from __future__ import annotations

import html as _html
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.detect.base import fmt_time

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "green"}


def print_verdict(console: Console, pm: Any) -> None:
    """The verdict block: what died and when, the cause, evidence, remedy, the bundle path."""
    v = pm.verdict
    style = _STYLE.get(str(v.severity), "")
    head = Text.assemble((f"{v.kind}", style), "  ", (f"[{v.playbook}]" if v.playbook else ""))
    console.print(head, highlight=False)
    console.print(Text(v.summary), highlight=False)
    if v.died_at:
        console.print(Text(f"died at: {fmt_time(v.died_at)}"), highlight=False)
    if v.cause and v.cause != v.summary:
        console.print(Text(f"cause: {v.cause}"), highlight=False)
    console.print(Text(f"confidence: {v.confidence}"), highlight=False)
    if v.confirm:
        console.print(Text(f"confirm: {v.confirm}"), highlight=False)
    if pm.evidence.tee_error:
        console.print(Text(f"tee failed: {pm.evidence.tee_error}"), highlight=False)
    if v.evidence:
        console.print("evidence:")
        for e in v.evidence[:8]:
            console.print(Text(f"  | {e}"), highlight=False)
    if v.remedy:
        console.print("remedy:")
        for r in v.remedy:
            console.print(Text(f"  - {r}"), highlight=False)
    others = [f for f in pm.findings if f.kind != v.kind][:6]
    if others:
        console.print("other findings:")
        for f in others:
            console.print(Text(f"  {f.severity}: {f.kind}: {f.summary}"), highlight=False)
    if pm.restarts:
        console.print("restart journal:")
        for e in pm.restarts:
            console.print(Text(f"  {e.line()}"), highlight=False)
    if pm.bundle:
        console.print(Text(f"bundle: {pm.bundle}"), highlight=False)


def _md_list(items: Sequence[str], code: bool = False) -> str:
    if not items:
        return "_none_\n"
    if code:
        return "```\n" + "\n".join(items) + "\n```\n"
    return "".join(f"- {x}\n" for x in items)


def markdown(pm: Any) -> str:
    """report.md: verdict, cause, evidence, remedy, findings, log tail, pane, kernel events."""
    v, ev = pm.verdict, pm.evidence
    m = ev.manifest
    out = [
        f"# Postmortem: {ev.target} run {ev.run_id or '-'}\n",
        f"**Verdict: {v.kind}**" + (f" (playbook `{v.playbook}`)" if v.playbook else "") + "\n",
        f"{v.summary}\n",
        f"- died at: {fmt_time(v.died_at)}\n- exit status: {ev.exit_status}\n"
        f"- container: {ev.container_status}\n- collected: {fmt_time(ev.collected_at)}\n",
    ]
    if ev.tee_error:
        out.append(f"- **tee failed** (train.log stopped there): `{ev.tee_error}`\n")
    if m is not None:
        out.append(f"- command: `{m.command}`\n- started: {fmt_time(m.started_at)}\n"
                   f"- GPUs: {list(m.gpus)}\n")  # fmt: skip
    out += ["\n## Cause\n", f"{v.cause or '-'}\n", f"\nConfidence: **{v.confidence}**\n"]
    if v.confirm:
        out.append(f"\nTo confirm: {v.confirm}\n")
    out += ["\n## Evidence\n", _md_list(v.evidence, True)]
    out += ["\n## Remedy\n", _md_list(v.remedy)]
    out += [
        "\n## Findings\n",
        _md_list([f"{f.severity} {f.kind}: {f.summary}" for f in pm.findings]),
    ]
    if pm.restarts:
        out += ["\n## Restart journal\n", _md_list([e.line() for e in pm.restarts])]
    out += ["\n## Log tail\n", _md_list(list(ev.log_tail[-50:]), True)]
    out += ["\n## Last pane screen\n", _md_list(list(ev.pane[-40:]), True)]
    events = [e.line for e in (ev.probe.kernel_events if ev.probe else ())]
    out += ["\n## Host kernel events\n", _md_list(events[-20:], True)]
    if ev.errors:
        out += ["\n## Collection problems\n", _md_list(list(ev.errors))]
    return "".join(out)


_W, _H, _PAD = 960, 150, 40
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _series(pm: Any) -> dict[str, list[tuple[float, dict[int, float]]]]:
    util: list[tuple[float, dict[int, float]]] = []
    mem: list[tuple[float, dict[int, float]]] = []
    for s in pm.history:
        u = {g.index: g.utilization_pct for g in s.gpus if g.utilization_pct is not None}
        m = {g.index: g.memory_used_mib for g in s.gpus if g.memory_used_mib is not None}
        if u:
            util.append((s.taken_at, u))
        if m:
            mem.append((s.taken_at, m))
    tok = [
        (float(r["time"]), {0: float(r["tok_s"])})
        for r in pm.evidence.metrics
        if isinstance(r.get("time"), (int, float)) and isinstance(r.get("tok_s"), (int, float))
    ]
    return {"GPU utilization (%)": util, "GPU memory used (MiB)": mem, "tokens/s": tok}


def _chart(title: str, rows: list[tuple[float, dict[int, float]]], t0: float, t1: float,
           death: float | None) -> str:  # fmt: skip
    span = max(t1 - t0, 1e-6)
    top = max([v for _, d in rows for v in d.values()] + [1.0])
    keys = sorted({k for _, d in rows for k in d})

    def x(t: float) -> float:
        return _PAD + (t - t0) / span * (_W - 2 * _PAD)

    def y(v: float) -> float:
        return _H - 20 - v / top * (_H - 40)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" role="img">',
        f'<rect width="{_W}" height="{_H}" fill="#fafafa" stroke="#ddd"/>',
        f'<text x="{_PAD}" y="14" font-size="12">{_html.escape(title)} (max {top:,.0f})</text>',
    ]
    for i, k in enumerate(keys):
        pts = " ".join(f"{x(t):.1f},{y(d[k]):.1f}" for t, d in rows if k in d)
        color = _COLORS[i % len(_COLORS)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}">'
                     f"<title>GPU {k}</title></polyline>")  # fmt: skip
    if not rows:
        parts.append(f'<text x="{_W / 2}" y="{_H / 2}" font-size="12">no samples</text>')
    if death is not None and t0 <= death <= t1:
        parts.append(f'<line x1="{x(death):.1f}" x2="{x(death):.1f}" y1="18" y2="{_H - 10}" '
                     'stroke="#d00" stroke-width="2" stroke-dasharray="4 3"/>'
                     f'<text x="{x(death) + 4:.1f}" y="30" fill="#d00" font-size="12">death</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def html(pm: Any) -> str:
    """report.html: self-contained (no external asset), the verdict and an inline SVG timeline."""
    v, ev = pm.verdict, pm.evidence
    series = _series(pm)
    times = [t for rows in series.values() for t, _ in rows]
    if v.died_at:
        times.append(v.died_at)
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    charts = "".join(_chart(k, rows, t0, t1, v.died_at) for k, rows in series.items())
    esc = _html.escape
    sev = {"critical": "#c00", "warning": "#b80", "info": "#080"}.get(str(v.severity), "#333")

    def pre(lines: Sequence[str]) -> str:
        return "<pre>" + esc("\n".join(lines) or "(none)") + "</pre>"

    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>postmortem {esc(ev.target)} {esc(ev.run_id or '')}</title>"
        "<style>body{font-family:sans-serif;margin:20px;color:#222}pre{background:#f4f4f4;white-space:pre-wrap;"
        "padding:8px;overflow:auto;font-size:12px}h1{font-size:20px}.v{font-size:18px;"
        f"color:{sev};font-weight:bold}}</style></head><body>"
        f"<h1>Postmortem: {esc(ev.target)} run {esc(ev.run_id or '-')}</h1>"
        f"<p class='v'>{esc(v.kind)}" + (f" [{esc(v.playbook)}]" if v.playbook else "") + "</p>"
        f"<p>{esc(v.summary)}</p><p>died at {esc(fmt_time(v.died_at))}; exit status "
        f"{esc(str(ev.exit_status))}; container {esc(str(ev.container_status))}</p>"
        + (
            f"<p><b>tee failed</b> (train.log stopped there): {esc(ev.tee_error)}</p>"
            if ev.tee_error
            else ""
        )
        + f"<p class='c'>confidence: <b>{esc(v.confidence)}</b>"
        + (f"; to confirm: {esc(v.confirm)}" if v.confirm else "")
        + "</p>"
        + f"<h2>Timeline</h2>{charts}"
        f"<h2>Evidence</h2>{pre(list(v.evidence))}"
        "<h2>Remedy</h2><ul>" + "".join(f"<li>{esc(r)}</li>" for r in v.remedy) + "</ul>"
        "<h2>Findings</h2><ul>"
        + "".join(
            f"<li>{esc(str(f.severity))} {esc(f.kind)}: {esc(f.summary)}</li>" for f in pm.findings
        )
        + "</ul>"
        + (f"<h2>Restart journal</h2>{pre([e.line() for e in pm.restarts])}" if pm.restarts else "")
        + f"<h2>Log tail</h2>{pre(list(ev.log_tail[-50:]))}"
        f"<h2>Last pane screen</h2>{pre(list(ev.pane[-40:]))}</body></html>\n"
    )
