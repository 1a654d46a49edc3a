"""report.html in real headless Chromium at two widths: the charts fill the page, the marker
labels the browser drew do not overlap, the screenshot's chart background spans the width.

Set ``ORCH_REPORT_SHOTS=<dir>`` to keep the screenshots (``report-<width>.png``) for a look.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator.views.postmortem import html
from orchestrator.views.scales import overlaps
from tests.postmortem import browser, report_case

pytestmark = pytest.mark.slow  # six Chromium starts, 20-40 s

MARGIN_PX = 20  # the page's body margin (views/postmortem.py _CSS)
CHART_BG = (0xFA, 0xFA, 0xFA)  # the charts' background rect (views/timeline.py _svg_open)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    browser.browser()
    out = tmp_path_factory.mktemp("report") / "report.html"
    out.write_text(html(report_case.postmortem()))
    return out


@pytest.mark.parametrize("width", [1400, 800])
def test_the_charts_fill_the_width_in_chromium(page: Path, width: int, tmp_path: Path) -> None:
    got = browser.measure(page, width, tmp_path / "profile")
    assert got["inner"] == width, got["inner"]
    assert got["body"] == width - 2 * MARGIN_PX, got["body"]
    assert len(got["charts"]) == 3
    for chart in got["charts"]:
        left, top, right, bottom = chart["box"]
        assert abs(left - MARGIN_PX) < 1 and abs(right - (width - MARGIN_PX)) < 1, chart["box"]
        assert bottom - top > 0.2 * (right - left), "the height scales with the width"
        for label in chart["markers"] + chart["yticks"]:  # every label inside its chart
            assert left <= label[0] and label[2] <= right, (label, chart["box"])
        assert overlaps(chart["markers"] + chart["yticks"]) == [], chart["markers"]

    png = browser.screenshot(page, tmp_path / f"report-{width}.png", width, 1100, tmp_path / "p2")
    lo, hi = browser.widest_run(png, CHART_BG)
    assert lo <= MARGIN_PX + 2 and hi >= width - MARGIN_PX - 3, (lo, hi, width)
    if shots := os.environ.get("ORCH_REPORT_SHOTS"):
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / f"report-{width}.png", Path(shots) / f"report-{width}.png")


@pytest.mark.parametrize("before_s", [0.0, 0.2])
def test_markers_at_one_instant_or_a_pixel_apart_do_not_overlap(
    before_s: float, tmp_path: Path
) -> None:
    """Measured by the browser with its own fonts, not from the layout's width estimate."""
    page = tmp_path / "report.html"
    page.write_text(html(report_case.postmortem(finding_before_death_s=before_s)))
    got = browser.measure(page, 800, tmp_path / "profile")
    for chart in got["charts"]:
        assert len(chart["markers"]) == 3
        assert overlaps(chart["markers"]) == [], chart["markers"]
