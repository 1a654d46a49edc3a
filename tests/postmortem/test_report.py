"""report.html and report.md of a single run's postmortem (pure: hand-built evidence, no
browser; tests/postmortem/test_report_browser.py opens the page in Chromium)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from orchestrator.config.limits import Limits
from orchestrator.postmortem.episodes import gpu_episodes
from orchestrator.postmortem.verdict import judge
from orchestrator.views.postmortem import html, markdown
from orchestrator.views.scales import MIB, PERCENT, TOK_S, Unit, axis, label_width, overlaps
from orchestrator.views.timeline import PAD_L, SMALL
from orchestrator.wire.model import GpuSample, Snapshot
from tests.postmortem import report_case
from tests.postmortem.report_case import GHOST, T0


def _charts(page: str) -> dict[str, str]:
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r'<svg [^>]*class="chart".*?<title>([^<]*)</title>.*?</svg>', page)
    }


def _attrs(tag: str) -> dict[str, str]:
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


def test_every_chart_is_a_responsive_self_contained_svg() -> None:
    page = html(report_case.postmortem())
    charts = _charts(page)
    assert set(charts) == {"GPU utilization", "GPU memory used", "tokens/s"}
    for svg in charts.values():
        head = _attrs(svg[: svg.index(">")])
        assert head["width"] == "100%" and head["viewBox"].startswith("0 0 1000 "), head
        assert "height" not in head, "a fixed height would not scale with the width"
    assert "<script" not in page
    assert re.findall(r"(?:src|href)=", page) == [], "the report loads nothing"
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}


def test_value_axes_have_ticks_in_units() -> None:
    charts = _charts(html(report_case.postmortem()))

    def ticks(title: str) -> list[str]:
        return re.findall(r'<text class="ytick"[^>]*>([^<]*)</text>', charts[title])

    assert ticks("GPU utilization") == ["0 %", "20 %", "40 %", "60 %", "80 %", "100 %"]
    assert ticks("GPU memory used") == ["0 GiB", "20 GiB", "40 GiB", "60 GiB", "80 GiB"]
    assert ticks("tokens/s")[-1] == "25k tok/s" and len(ticks("tokens/s")) == 6


@pytest.mark.parametrize("peak", [0.0, 0.5, 99.0, 9_999.0, 21_432.0, 999_999.0, 2.5e6, 7.7e9])
@pytest.mark.parametrize("unit", [PERCENT, MIB, TOK_S])
def test_every_tick_label_fits_the_left_margin(peak: float, unit: Unit) -> None:
    for label in axis([peak], unit).labels:
        assert label_width(label, SMALL) + 6 <= PAD_L, label


def test_an_all_zero_memory_chart_reads_0_to_1_gib() -> None:
    pm = report_case.postmortem()
    zero = tuple(
        replace(s, gpus=tuple(replace(g, memory_used_mib=0.0) for g in s.gpus)) for s in pm.history
    )
    svg = _charts(html(replace(pm, history=zero)))["GPU memory used"]
    labels = re.findall(r'<text class="ytick"[^>]*>([^<]*)</text>', svg)
    assert labels[0] == "0 GiB" and labels[-1] == "1.0 GiB" and len(labels) == 6, labels
    assert "every sample is 0 MiB" in svg


def _subpaths(svg: str, index: int) -> list[list[float]]:
    """The x coordinates of each subpath of the ``index``-th series path."""
    d = re.findall(r'<path class="series" d="([^"]*)"', svg)[index]
    return [[float(p.split(",")[0]) for p in sub.split(" L")] for sub in d.split("M")[1:]]


def test_no_line_is_drawn_across_a_pause_in_the_samples() -> None:
    svg = _charts(html(report_case.postmortem()))["GPU utilization"]
    bands = [
        (float(a["x"]), float(a["x"]) + float(a["width"]))
        for a in map(_attrs, re.findall(r'<rect class="band gap"[^>]*>', svg))
    ]
    assert len(bands) == 2, "the recorder's pause and the wait for the postmortem's reading"
    for i in range(4):  # every GPU's line
        subs = _subpaths(svg, i)
        assert len(subs) == 2, subs  # before and after the pause; the final reading is a dot
        for xs in subs:
            for a, b in zip(xs, xs[1:], strict=False):
                assert not any(a <= lo and b >= hi for lo, hi in bands), (a, b, bands)
    assert svg.count('<circle class="alone"') == 4, "the final reading of each GPU, alone"


def _marker_boxes(svg: str) -> list[tuple[float, float, float, float]]:
    out = []
    for tag in re.findall(r'<text class="marker"[^>]*>', svg):
        a = _attrs(tag)
        y = float(a["y"])
        out.append((float(a["data-left"]), y - 12, float(a["data-right"]), y))
    return out


@pytest.mark.parametrize("before_s", [0.0, 0.2, 1.0])
def test_marker_labels_do_not_overlap(before_s: float) -> None:
    """The first finding on the death's instant, about one unit (0.2 s) and 1 s before it."""
    pm = report_case.postmortem(finding_before_death_s=before_s)
    for title, svg in _charts(html(pm)).items():
        boxes = _marker_boxes(svg)
        assert len(boxes) == 3, (title, boxes)  # launch, first finding, death
        assert overlaps(boxes) == [], (title, boxes)
        assert all(left >= 0 and right <= 1000 for left, _, right, _ in boxes), boxes


def test_the_key_explains_every_mark() -> None:
    page = html(report_case.postmortem())
    key = page[page.index("<ul class='key'>") : page.index("</ul>", page.index("<ul class='key'>"))]
    for meaning in (
        "a series",
        "a sample alone between two gaps",
        "no samples for over 3 times",
        "ghost-utilization episode",
        "launch:",
        "first finding:",
        "death:",
        "GPU n*: a GPU of this run",
    ):
        assert meaning in key, meaning
    assert "nvml-error episode" not in key, "only what the charts show"
    assert "GPU 0*" in page and "* this run&#x27;s GPU" in page


def test_a_ghost_episode_that_cleared_is_listed_in_findings() -> None:
    pm = report_case.postmortem()
    assert [f.kind for f in pm.findings] == ["crashed"], "the detectors judge the last samples"
    (ep,) = pm.episodes
    assert (ep.kind, ep.gpu, ep.start, ep.end) == (
        "ghost-utilization",
        3,
        T0 + GHOST[0],
        T0 + GHOST[1],
    )
    assert ep.cleared_at == T0 + GHOST[1] + 2
    page = html(pm)
    findings = page[page.index("<h2>Findings</h2>") : page.index("<h2>Log tail</h2>")]
    assert "Episodes in the GPU history (1)" in findings
    row = re.search(r"<tr class='episode'>.*?</tr>", findings)
    assert row is not None
    for cell in (
        "ghost-utilization",
        "<td>3</td>",
        "2023-11-14T22:13:50Z",
        "2023-11-14T22:14:10Z",
        "cleared by 2023-11-14T22:14:12Z",
    ):
        assert cell in row.group(0), cell
    md = markdown(pm)
    assert "### Episodes in the GPU history" in md and "cleared by 2023-11-14T22:14:12Z" in md
    assert pm.to_dict()["episodes"][0]["cleared_at"] == T0 + GHOST[1] + 2
    assert "death (crashed) 22:14:50" in page


def test_an_episode_on_at_the_end_is_the_findings() -> None:
    ev = report_case.evidence()
    ghost = Snapshot(
        target="ct200",
        taken_at=T0 + 200,
        gpus=tuple(
            GpuSample(index=i, utilization_pct=100.0 if i == 2 else 0.0, memory_used_mib=0.0)
            for i in range(4)
        ),
    )
    last = dict(ev.gpu_history[-1], t=T0 + 198)
    last["gpus"] = [dict(g, utilization_pct=100.0) if g["index"] == 2 else g for g in last["gpus"]]
    pm = judge(replace(ev, final=ghost, gpu_history=(*ev.gpu_history, last)))
    on = [e for e in pm.episodes if e.gpu == 2]
    assert len(on) == 1 and on[0].cleared_at is None and on[0].samples == 2
    assert any(f.kind == "ghost-utilization" and f.gpus == (2,) for f in pm.findings)
    assert "still on at the last sample (the finding above)" in html(pm)


def _snap(t: float, util: float, mem: float, error: str | None = None, ok: bool = True) -> Snapshot:
    g = GpuSample(index=0, utilization_pct=util, memory_used_mib=mem, error=error)
    return Snapshot(target="ct", taken_at=t, gpus=(g,), reachable=ok)


def test_episodes_use_the_detectors_conditions() -> None:
    limits = Limits()
    one = [_snap(0, 0, 0), _snap(2, 100, 0), _snap(4, 0, 0)]
    assert gpu_episodes(one, limits) == (), f"fewer than ghost_samples={limits.ghost_samples}"
    busy = [_snap(0, 100, 20_000), _snap(2, 100, 20_000)]
    assert gpu_episodes(busy, limits) == (), "busy with memory is work, not a ghost"
    # an unreachable sample says nothing about the GPU: it neither ends nor extends an episode
    gap = [_snap(0, 100, 0), _snap(2, 0, 0, ok=False), _snap(4, 100, 0), _snap(6, 0, 0)]
    (e,) = gpu_episodes(gap, limits)
    assert (e.start, e.end, e.samples, e.cleared_at) == (0, 4, 2, 6)
    lost = [_snap(0, 50, 9000), _snap(2, 0, 0, error="gpu-lost"), _snap(4, 0, 0, error="gpu-lost")]
    (e,) = gpu_episodes(lost, limits)
    assert (e.kind, e.start, e.end, e.cleared_at, e.detail) == (
        "nvml-error",
        2,
        4,
        None,
        "error gpu-lost",
    )
