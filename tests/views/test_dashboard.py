"""The shipped Grafana dashboard, read as Grafana reads it (its queries run against a real
Prometheus in test_grafana_e2e.py)."""

from __future__ import annotations

import json
import re

from tests.views.conftest import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "orch-fleet.json"


def _dashboard() -> dict:
    doc: dict = json.loads(DASHBOARD.read_text())
    return doc


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    """The classic dashboard JSON model (grafana.com/docs, "Dashboard JSON model"): panels
    with unique ids on the 24-column grid, Prometheus targets that name the datasource
    variable, and that variable."""
    doc = _dashboard()
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"], p["title"]
        used = {v for t in p["targets"] for v in re.findall(r"\$(\w+)", t["expr"])}
        assert used <= set(variables) | {"__rate_interval", "__range"}, (p["title"], used)
