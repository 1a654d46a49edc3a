"""Render a postmortem: the verdict on the terminal (rich), and the bundle's report.md / report.html.

``orchestrator.postmortem.collect.write_bundle`` writes :func:`markdown` and :func:`html`
(self-contained HTML: inline SVG timelines of per-GPU utilization and memory and tokens/s
that fill the page's width, with clock and value axes, a legend per GPU, the GPU episodes
shaded, gaps in the samples left as gaps, markers for the launch, the first finding and the
death (views/timeline.py), a key to every mark, and every episode under Findings).
"""

from __future__ import annotations

import html as _html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.detect.base import fmt_time
from orchestrator.postmortem.episodes import Episode, finding_of
from orchestrator.views.scales import GAP_FACTOR, MIB, PERCENT, TOK_S, Unit
from orchestrator.views.timeline import Band, Marker, Series, chart, key, marks_of, span_of
from orchestrator.wire.text import fence, visible

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "green"}


def print_verdict(console: Console, pm: Any) -> None:
    """The verdict block: what died and when, the cause, evidence, remedy, the bundle path."""
    v = pm.verdict
    style = _STYLE.get(str(v.severity), "")
    head = Text.assemble(
        (f"{v.kind}", style), "  ", (visible(f"[{v.playbook}]") if v.playbook else "")
    )
    console.print(head, highlight=False)
    console.print(_safe(v.summary), highlight=False)
    if v.died_at:
        console.print(_safe(f"died at: {fmt_time(v.died_at)}"), highlight=False)
    if v.cause and v.cause != v.summary:
        console.print(_safe(f"cause: {v.cause}"), highlight=False)
    console.print(_safe(f"confidence: {v.confidence}"), highlight=False)
    if v.confirm:
        console.print(_safe(f"confirm: {v.confirm}"), highlight=False)
    if pm.evidence.tee_error:
        console.print(_safe(f"tee failed: {pm.evidence.tee_error}"), highlight=False)
    if getattr(pm.evidence, "kernel_log_note", None):
        console.print(_safe(f"kernel log: {pm.evidence.kernel_log_note}"), highlight=False)
    if v.evidence:
        console.print("evidence:")
        for e in v.evidence[:8]:
            console.print(_safe(f"  | {e}"), highlight=False)
    if v.remedy:
        console.print("remedy:")
        for r in v.remedy:
            console.print(_safe(f"  - {r}"), highlight=False)
    others = [f for f in pm.findings if f.kind != v.kind][:6]
    if others:
        console.print("other findings:")
        for f in others:
            console.print(_safe(f"  {f.severity}: {f.kind}: {f.summary}"), highlight=False)
    if pm.restarts:
        console.print("restart journal:")
        for e in pm.restarts:
            console.print(_safe(f"  {e.line()}"), highlight=False)
    if pm.bundle:
        console.print(_safe(f"bundle: {pm.bundle}"), highlight=False)
        report = Path(pm.bundle) / "report.html"
        if report.is_file():  # the page with the timelines: what to open next
            console.print(_safe(f"report: {report}"), highlight=False, soft_wrap=True)


def _safe(text: str) -> Text:
    """Remote text for the terminal: controls shown (:func:`visible`), never markup."""
    return Text(visible(text, multiline=True))


def _code(text: str) -> str:
    """Inline Markdown code ``text`` cannot close (a longer backtick run than its own)."""
    tick = fence(text)
    return f"{tick} {text} {tick}"


def _md_list(items: Sequence[str], code: bool = False) -> str:
    if not items:
        return "_none_\n"
    if code:
        body = "\n".join(items)
        tick = fence(body)
        return f"{tick}\n{body}\n{tick}\n"
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
        out.append(f"- **tee failed** (train.log stopped there): {_code(ev.tee_error)}\n")
    if m is not None:
        out.append(
            f"- command: {_code(m.command)}\n- started: {fmt_time(m.started_at)}\n"
            f"- GPUs: {list(m.gpus)}\n"
        )
    out += ["\n## Cause\n", f"{v.cause or '-'}\n", f"\nConfidence: **{v.confidence}**\n"]
    if v.confirm:
        out.append(f"\nTo confirm: {v.confirm}\n")
    out += ["\n## Evidence\n", _md_list(v.evidence, True)]
    out += ["\n## Remedy\n", _md_list(v.remedy)]
    out += [
        "\n## Findings\n",
        _md_list([f"{f.severity} {f.kind}: {f.summary}" for f in pm.findings]),
    ]
    if getattr(pm, "episodes", ()):
        out += [
            "\n### Episodes in the GPU history\n",
            _md_list([f"{e.line()}" for e, _ in episode_rows(pm)]),
        ]
    if pm.restarts:
        out += ["\n## Restart journal\n", _md_list([e.line() for e in pm.restarts])]
    out += ["\n## Log tail\n", _md_list(list(ev.log_tail[-50:]), True)]
    out += ["\n## Last pane screen\n", _md_list(list(ev.pane[-40:]), True)]
    events = [e.line for e in (ev.probe.kernel_events if ev.probe else ())]
    out += ["\n## Host kernel events\n", _md_list(events[-20:], True)]
    if getattr(ev, "kernel_log_note", None):
        out.append(f"\nNote: {ev.kernel_log_note}\n")
    if ev.errors:
        out += ["\n## Collection problems\n", _md_list(list(ev.errors))]
    return visible("".join(out), multiline=True)  # nothing from the container is a control


def _series(pm: Any) -> dict[str, tuple[list[Series], Unit]]:
    """The single run's charts: per-GPU utilization and memory (one legend entry per GPU,
    ``*`` marking the run's own GPUs), and tokens/s, each with its unit."""
    util: dict[int, list[tuple[float, float]]] = {}
    mem: dict[int, list[tuple[float, float]]] = {}
    for s in pm.history:
        for g in s.gpus:
            if g.utilization_pct is not None:
                util.setdefault(g.index, []).append((s.taken_at, g.utilization_pct))
            if g.memory_used_mib is not None:
                mem.setdefault(g.index, []).append((s.taken_at, g.memory_used_mib))
    mine = _mine(pm)

    def named(rows: dict[int, list[tuple[float, float]]]) -> list[Series]:
        return [
            Series(f"GPU {k}" + ("*" if k in mine else ""), tuple(v))
            for k, v in sorted(rows.items())
        ]

    tok = tuple(
        (float(r["time"]), float(r["tok_s"]))
        for r in pm.evidence.metrics
        if isinstance(r.get("time"), (int, float)) and isinstance(r.get("tok_s"), (int, float))
    )
    return {
        "GPU utilization": (named(util), PERCENT),
        "GPU memory used": (named(mem), MIB),
        "tokens/s": ([Series("tokens/s", tok)] if tok else [], TOK_S),
    }


def _mine(pm: Any) -> set[int]:
    return set(pm.evidence.manifest.gpus) if pm.evidence.manifest else set()


def markers(pm: Any) -> list[Marker]:
    """Launch, first finding, the death (the first failure of a single run)."""
    out: list[Marker] = []
    m = pm.evidence.manifest
    if m is not None:
        out.append(Marker(m.started_at, "launch", "launch"))
    firsts = [f.since for f in pm.findings if f.since is not None]
    if firsts:
        out.append(Marker(min(firsts), "finding", "first finding"))
    if pm.verdict.died_at:
        out.append(Marker(pm.verdict.died_at, "failure", f"death ({pm.verdict.kind})"))
    return out


def _episodes(pm: Any) -> tuple[Episode, ...]:
    return tuple(getattr(pm, "episodes", ()))


def episode_bands(pm: Any) -> list[Band]:
    """A shaded band per episode in the GPU history (cleared or not)."""
    return [Band(e.start, e.end, e.kind, e.line()) for e in _episodes(pm)]


_MARKER_MEANING = {
    "launch": "launch: the run started (its manifest's start time)",
    "finding": "first finding: the earliest sample in which a finding below was seen",
    "failure": "death: when the run died (its exit status was written; else the first sample "
    "with no live process)",
}
_BAND_MEANING = {
    "ghost-utilization": "ghost-utilization episode: the GPU read busy while nearly empty "
    "(each one, cleared or not, under Findings)",
    "nvml-error": "nvml-error episode: the GPU answered NVML with an error (under Findings)",
}


_DRAWN = {
    "line": "a series: one colour per GPU (named in each chart's legend), one point per sample",
    "dot": "a sample alone between two gaps (such as the postmortem's own last reading)",
    "band:gap": f"no samples for over {GAP_FACTOR:g} times the median interval: the line "
    "breaks there, nothing is drawn across",
}


def key_entries(pm: Any, marks: Sequence[Marker], drawn: set[str]) -> list[tuple[str, str]]:
    """What each mark of the timeline means: the lines, dots and gaps ``drawn``
    (:func:`~orchestrator.views.timeline.marks_of`), every band and marker kind shown, and
    the ``*`` of the run's own GPUs."""
    out = [(k, text) for k, text in _DRAWN.items() if k in drawn]
    out += [(f"band:{k}", _BAND_MEANING.get(k, k)) for k in sorted({e.kind for e in _episodes(pm)})]
    kinds = dict.fromkeys(m.kind for m in marks)
    out += [(f"marker:{k}", _MARKER_MEANING.get(k, k)) for k in kinds]
    if _mine(pm):
        out.append(
            (
                "text:*",
                "GPU n*: a GPU of this run (its manifest's GPU list); the others "
                "are the container's other GPUs",
            )
        )
    return out


def episode_rows(pm: Any) -> list[tuple[Episode, str]]:
    """Each episode with its state: cleared (when) or still on at the last sample, and
    whether a finding above reports it."""
    out = []
    for e in _episodes(pm):
        if e.cleared_at is not None:
            state = f"cleared by {fmt_time(e.cleared_at)}"
        elif finding_of(e, pm.findings) is not None:
            state = "still on at the last sample (the finding above)"
        else:
            state = "still on at the last sample"
        out.append((e, state))
    return out


_CSS = (
    "body{font-family:sans-serif;margin:20px;color:#222}pre{background:#f4f4f4;"
    "white-space:pre-wrap;padding:8px;overflow:auto;font-size:12px}h1{font-size:20px}"
    "table.ep{border-collapse:collapse;font-size:13px}table.ep td,table.ep th{padding:2px 10px;"
    "text-align:left;border-bottom:1px solid #eee}.cleared{color:#2a7a2a;font-weight:bold}"
    "ul.key{list-style:none;padding:0;columns:2 420px;font-size:13px;margin:4px 0 16px}"
    "ul.key li{margin:2px 0;break-inside:avoid}"
)


def _timeline(pm: Any) -> str:
    """The charts (full width, one per metric) and the key of every mark on them."""
    series = _series(pm)
    marks = markers(pm)
    times = [t for rows, _ in series.values() for s in rows for t, _ in s.points]
    t0, t1 = span_of(times + [mk.at for mk in marks])
    bands = episode_bands(pm)
    note = "* this run's GPU" if _mine(pm) else ""
    charts = "".join(
        chart(
            title,
            rows,
            t0,
            t1,
            marks,
            unit,
            bands=bands if unit is not TOK_S else (),
            note=note if unit is not TOK_S else "",
        )
        for title, (rows, unit) in series.items()
    )
    drawn = set().union(*(marks_of(rows, t0, t1) for rows, _ in series.values()))
    return charts + key(key_entries(pm, marks, drawn))


def _findings_html(pm: Any) -> str:
    esc = _html.escape
    out = "<ul>" + "".join(
        f"<li>{esc(str(f.severity))} {esc(f.kind)}: {esc(f.summary)}</li>" for f in pm.findings
    )
    out += "</ul>" if pm.findings else "<li>none at the last sample</li></ul>"
    rows = episode_rows(pm)
    if not rows:
        return out
    out += (
        f"<h3>Episodes in the GPU history ({len(rows)})</h3><table class='ep'><tr><th>kind</th>"
        "<th>GPU</th><th>start</th><th>end</th><th>samples</th><th>state</th><th>detail</th></tr>"
    )
    for e, state in rows:
        cls = " class='cleared'" if e.cleared else ""
        out += (
            f"<tr class='episode'><td>{esc(e.kind)}</td><td>{e.gpu}</td>"
            f"<td>{esc(fmt_time(e.start))}</td><td>{esc(fmt_time(e.end))}</td>"
            f"<td>{e.samples} ({e.end - e.start:.0f} s)</td><td{cls}>{esc(state)}</td>"
            f"<td>{esc(e.detail)}</td></tr>"
        )
    return out + "</table>"


def html(pm: Any) -> str:
    """report.html: self-contained (no script, no external asset), the verdict, inline SVG
    timelines that fill the page's width, their key, the findings and every episode."""
    v, ev = pm.verdict, pm.evidence
    esc = _html.escape
    sev = {"critical": "#c00", "warning": "#b80", "info": "#080"}.get(str(v.severity), "#333")

    def pre(lines: Sequence[str]) -> str:
        return "<pre>" + esc("\n".join(lines) or "(none)") + "</pre>"

    return visible(
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>postmortem {esc(ev.target)} {esc(ev.run_id or '')}</title>"
        f"<style>{_CSS}.v{{font-size:18px;color:{sev};font-weight:bold}}</style></head><body>"
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
        + f"<h2>Timeline</h2>{_timeline(pm)}"
        f"<h2>Evidence</h2>{pre(list(v.evidence))}"
        "<h2>Remedy</h2><ul>" + "".join(f"<li>{esc(r)}</li>" for r in v.remedy) + "</ul>"
        f"<h2>Findings</h2>{_findings_html(pm)}"
        + (f"<h2>Restart journal</h2>{pre([e.line() for e in pm.restarts])}" if pm.restarts else "")
        + f"<h2>Log tail</h2>{pre(list(ev.log_tail[-50:]))}"
        f"<h2>Last pane screen</h2>{pre(list(ev.pane[-40:]))}</body></html>\n",
        multiline=True,
    )
