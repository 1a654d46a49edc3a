"""Render a job's postmortem: the verdict on the terminal, and the bundle's report.md /
report.html (one timeline of every node: lanes of events, tokens/s per node, clock offsets).
"""

from __future__ import annotations

import html as _html
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.detect.base import fmt_time
from orchestrator.views.scales import GAP_FACTOR
from orchestrator.views.timeline import Marker, Series, chart, key, lanes, marks_of, span_of
from orchestrator.wire.text import fence, visible

_STYLE = {"consequence": "yellow", "cause": "bold red", "unknown": "magenta"}


def _safe(text: str) -> Text:
    """Remote text for the terminal: controls shown (:func:`visible`), never markup."""
    return Text(visible(text, multiline=True))


def print_job_verdict(console: Console, pm: Any) -> None:
    """The job verdict: first failure (node, rank, when, evidence), consequences, nodes,
    clock offsets, remedy, bundle."""
    v = pm.verdict
    console.print(
        Text.assemble(
            (v.kind, "bold red" if v.first else "green"),
            "  ",
            f"[{v.playbook}]" if v.playbook else "",
        ),
        highlight=False,
    )
    console.print(_safe(v.summary), highlight=False)
    f = v.first
    if f is not None:
        console.print(
            _safe(f"first failure: {f.label} on {f.host} at {fmt_time(f.at)}"), highlight=False
        )
        for e in f.evidence[:4]:
            console.print(_safe(f"  | {e}"), highlight=False)
    if v.consequences:
        console.print("consequences:")
        for c in v.consequences:
            line = _safe(f"  {c.label} at {fmt_time(c.at)}: {c.what}")
            line.stylize(_STYLE.get(c.role, ""))
            console.print(line, highlight=False)
            for e in c.evidence[:1]:
                console.print(_safe(f"    | {e}"), highlight=False)
    console.print("nodes:")
    for n in pm.nodes:
        ev = n.evidence
        role = f", {n.failure.role}" if n.failure else ""
        console.print(
            _safe(
                f"  rank {n.node.rank} {n.node.container} on {n.host}: "
                f"{n.postmortem.verdict.kind}, exit status {ev.exit_status}, container "
                f"{ev.container_status}{role}"
            ),
            highlight=False,
        )
    offs = ", ".join(
        f"{o.host} {o.offset_s * 1000:+.1f} ms (±{o.uncertainty_s * 1000:.1f})"
        + (f" [{o.error}]" if o.error else "")
        for o in pm.offsets
    )
    console.print(
        _safe(f"clock offsets (host - orch): {offs or 'none (all local)'}"), highlight=False
    )
    if v.remedy:
        console.print("remedy:")
        for r in v.remedy:
            console.print(_safe(f"  - {r}"), highlight=False)
    if pm.bundle:
        console.print(_safe(f"bundle: {pm.bundle}"), highlight=False)


def _fence(lines: Sequence[str]) -> str:
    if not lines:
        return "_none_\n"
    body = "\n".join(lines)
    return f"{fence(body)}\n{body}\n{fence(body)}\n"  # a log line of ``` cannot close it


def markdown(pm: Any) -> str:
    """report.md: verdict, first failure, consequences, nodes, clock offsets, timeline."""
    v = pm.verdict
    out = [
        f"# Postmortem: job {pm.job} run {pm.run_id}\n",
        f"**Verdict: {v.kind}**" + (f" (playbook `{v.playbook}`)" if v.playbook else "") + "\n",
        f"{v.summary}\n",
    ]
    if v.first is not None:
        f = v.first
        out += [
            f"\n## First failure\n\n- node: {f.node} (rank {f.rank}) on {f.host}\n"
            f"- at: {fmt_time(f.at)}\n- what: {f.what}\n",
            _fence(list(f.evidence)),
        ]
    if v.consequences:
        out.append("\n## Consequences\n\n")
        out += [f"- {c.label} at {fmt_time(c.at)}: {c.what} ({c.role})\n" for c in v.consequences]
    out.append(
        "\n## Nodes\n\n| rank | node | host | verdict | exit status | container |\n|---|---|---|---|---|---|\n"
    )
    for n in pm.nodes:
        ev = n.evidence
        out.append(
            f"| {n.node.rank} | {n.node.container} | {n.host} | {n.postmortem.verdict.kind} | "
            f"{ev.exit_status} | {ev.container_status} |\n"
        )
    out.append("\n## Clock offsets (host minus orch)\n\n")
    out += [
        f"- {o.host}: {o.offset_s * 1000:+.1f} ms (±{o.uncertainty_s * 1000:.1f} ms)"
        + (f", {o.error}" if o.error else "")
        + "\n"
        for o in pm.offsets
    ] or ["_all local_\n"]
    out += [
        "\n## Timeline (orch's clock, UTC)\n\n",
        _fence(
            [f"{fmt_time(e.at)}  {e.node} (rank {e.rank})  {e.kind}: {e.text}" for e in pm.timeline]
        ),
    ]
    if v.remedy:
        out += ["\n## Remedy\n\n", *(f"- {r}\n" for r in v.remedy)]
    out.append("\nEach node's own bundle is in its sub-directory (`<rank>-<node>/`).\n")
    return visible("".join(out), multiline=True)


def _markers(pm: Any) -> list[Marker]:
    out = [Marker(e.at, "launch", f"launch {e.node}") for e in pm.timeline if e.kind == "launch"][
        :1
    ]
    firsts = [f.since for n in pm.nodes for f in n.postmortem.findings if f.since is not None]
    if firsts:
        out.append(Marker(min(firsts), "finding", "first finding"))
    if pm.verdict.first is not None and pm.verdict.first.at is not None:
        f = pm.verdict.first
        out.append(Marker(f.at, "failure", f"first failure: {f.node}"))
    out += [Marker(e.at, "death", f"{e.node} died") for e in pm.timeline if e.kind == "death"]
    return out


_MARKS = {
    "launch": "launch: the first node's launch",
    "finding": "first finding: the earliest sample in which any node's finding was seen",
    "failure": "first failure: the node that failed first (the job's verdict)",
    "death": "a node died (its exit status, else its last live sample)",
}


def _key(marks: Sequence[Marker], drawn: set[str]) -> str:
    """The key of the job report's marks: lane dots, the tokens/s lines, gaps, markers."""
    entries = [
        (
            "dot",
            "an event in a node's lane (colour by kind: launch green, death dark "
            "red, error orange, others blue); hover it for its text",
        )
    ]
    if "line" in drawn:
        entries.append(("line", "tokens/s of a node (one colour per node, named in the legend)"))
    if "band:gap" in drawn:
        entries.append(
            ("band:gap", f"no samples for over {GAP_FACTOR:g} times the median interval")
        )
    entries += [(f"marker:{k}", _MARKS.get(k, k)) for k in dict.fromkeys(m.kind for m in marks)]
    return key(entries)


def html(pm: Any) -> str:
    """report.html: self-contained; the verdict, one lane per node (launch, steps, kernel
    events, deaths), tokens/s per node, markers, clock offsets."""
    esc = _html.escape
    v = pm.verdict
    marks = _markers(pm)
    rates = [
        Series(
            f"{n.node.container} (rank {n.node.rank})",
            tuple(
                (n.to_orch(float(r["time"])) or 0.0, float(r["tok_s"]))
                for r in n.evidence.metrics
                if isinstance(r.get("time"), (int, float))
                and isinstance(r.get("tok_s"), (int, float))
            ),
        )
        for n in pm.nodes
    ]
    times = [e.at for e in pm.timeline] + [t for s in rates for t, _ in s.points]
    t0, t1 = span_of(times + [m.at for m in marks])
    rows = [
        (
            f"{n.node.container} r{n.node.rank}",
            [(e.at, e.kind, e.text) for e in pm.timeline if e.node == n.node.container],
        )
        for n in pm.nodes
    ]
    first = v.first
    head = (
        f"<p><b>First failure:</b> {esc(first.label)} on {esc(str(first.host))} at "
        f"{esc(fmt_time(first.at))}: {esc(first.what)}</p><pre>{esc(chr(10).join(first.evidence))}</pre>"
        if first
        else ""
    )
    cons = "".join(
        f"<li>{esc(c.label)} at {esc(fmt_time(c.at))}: {esc(c.what)} ({esc(c.role)})</li>"
        for c in v.consequences
    )
    nodes = "".join(
        f"<tr><td>{n.node.rank}</td><td>{esc(n.node.container)}</td><td>{esc(n.host)}</td>"
        f"<td>{esc(n.postmortem.verdict.kind)}</td><td>{esc(str(n.evidence.exit_status))}</td>"
        f"<td>{n.offset.offset_s * 1000:+.1f} ms</td></tr>"
        for n in pm.nodes
    )
    events = "\n".join(
        f"{fmt_time(e.at)}  {e.node} (rank {e.rank})  {e.kind}: {e.text}" for e in pm.timeline
    )
    return visible(
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>postmortem job {esc(pm.job)} {esc(pm.run_id)}</title>"
        "<style>body{font-family:sans-serif;margin:20px;color:#222}pre{background:#f4f4f4;"
        "white-space:pre-wrap;padding:8px;font-size:12px}td,th{padding:2px 8px;text-align:left}"
        ".v{font-size:18px;color:#c00;font-weight:bold}ul.key{list-style:none;padding:0;"
        "font-size:13px}</style></head><body>"
        f"<h1>Postmortem: job {esc(pm.job)} run {esc(pm.run_id)}</h1>"
        f"<p class='v'>{esc(v.kind)}" + (f" [{esc(v.playbook)}]" if v.playbook else "") + "</p>"
        f"<p>{esc(v.summary)}</p>{head}"
        + (f"<h2>Consequences</h2><ul>{cons}</ul>" if cons else "")
        + "<h2>Timeline</h2>"
        + lanes("events per node (hover a dot)", rows, t0, t1, marks)
        + chart("tokens/s per node", rates, t0, t1, marks)
        + _key(marks, marks_of(rates, t0, t1))
        + "<h2>Nodes</h2><table><tr><th>rank</th><th>node</th><th>host</th><th>verdict</th>"
        f"<th>exit status</th><th>clock offset</th></tr>{nodes}</table>"
        + "<h2>Remedy</h2><ul>"
        + "".join(f"<li>{esc(r)}</li>" for r in v.remedy)
        + "</ul>"
        + f"<h2>Events</h2><pre>{esc(events)}</pre></body></html>\n",
        multiline=True,
    )
