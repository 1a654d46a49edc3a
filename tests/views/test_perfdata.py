"""``orch check``'s performance data, read back by a strict reader written from the
Monitoring Plugins guidelines and the Nagios plugin API (tests/views/nagios_format.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.config.limits import Limits
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.sweep import CRITICAL, CheckReport
from orchestrator.views import check
from orchestrator.views.perfdata import MIB, with_perfdata
from orchestrator.wire.model import Finding, Severity, Snapshot
from tests.views.nagios_format import FormatError, parse_output, parse_perfdata
from tests.views.snapshots import TOTAL_MIB, gpus, running


def _report() -> CheckReport:
    ghost = Finding(
        "ghost-utilization", Severity.CRITICAL, "ct200", "GPU 3 busy | 0 MiB", gpus=(3,)
    )
    stall = Finding("stall", Severity.WARNING, "it's=odd", "no step")
    ct200 = running("ct200", gpus=gpus({3: 100.0}, {0: 70000.0}), tps=21500.0)
    run = ct200.run
    assert run is not None
    ct200 = dataclasses.replace(
        ct200, run=dataclasses.replace(run, disk_free_mib=2048.0, disk_total_mib=10240.0)
    )
    odd = running("it's=odd", gpus=gpus(n=1), tps=4300.5)
    return CheckReport(
        CRITICAL,
        (
            Judgement("ct200", ct200, "running", (ghost,), host="pve1"),
            Judgement("it's=odd", odd, "stalled", (stall,), host="pve1"),
            Judgement("ct201", running("ct201"), "running", (), host="pve1"),
            Judgement("ct202", Snapshot.unreachable("ct202", 1.0, "refused"), "unreachable"),
        ),
    )


def _out(limits: dict[str, Limits] | None = None):
    report = _report()
    return parse_output("\n".join(with_perfdata(check.lines(report), report, limits)) + "\n")


def test_every_item_is_in_the_guidelines_format_and_the_text_is_kept() -> None:
    report = _report()
    out = _out()
    assert out.text == check.lines(report)[0]
    assert len(out.long_text) == len(check.lines(report)) - 1
    assert "GPU 3 busy / 0 MiB" in "\n".join(out.long_text)  # a '|' in a summary is no perfdata
    labels = [i.label for i in out.perfdata]
    assert len(labels) == len(set(labels)), labels
    assert all("=" not in lab and "'" not in lab and " " not in lab for lab in labels)


def test_the_counts_are_the_status_lines() -> None:
    got = {i.label: i for i in _out().perfdata}
    assert {
        k: got[k].value
        for k in (
            "targets",
            "targets_ok",
            "targets_warning",
            "targets_critical",
            "targets_unknown",
            "findings",
            "findings_critical",
        )
    } == {
        "targets": 4,
        "targets_ok": 1,
        "targets_warning": 1,
        "targets_critical": 1,
        "targets_unknown": 1,
        "findings": 2,
        "findings_critical": 1,
    }
    crit, warn, unreach = map(
        int, re.findall(r"(\d+) (?:critical|warning|unreachable)", _out().text)
    )
    assert (crit, warn, unreach) == (
        got["findings_critical"].value,
        got["findings"].value - got["findings_critical"].value,
        got["targets_unknown"].value,
    )
    assert got["targets_critical"].crit == "0" and got["targets_warning"].warn == "0"


def test_per_target_and_per_gpu_items_with_their_thresholds() -> None:
    got = {i.label: i for i in _out({"ct200": Limits(min_tokens_per_s=10000.0)}).perfdata}
    assert got["ct200_tokens_per_s"].value == 21500 and got["ct200_tokens_per_s"].warn == "10000:"
    assert got["it_s_odd_tokens_per_s"].value == 4300.5 and got["it_s_odd_tokens_per_s"].warn == ""
    disk = got["ct200_disk_free"]
    assert (disk.value, disk.uom, disk.max) == (2048 * MIB, "B", 10240 * MIB)
    assert (disk.warn, disk.crit) == (f"{5 * 1024 * MIB}:", f"{1024 * MIB}:")
    util = got["ct200_gpu3_util"]
    assert (util.value, util.uom, util.min, util.max) == (100, "%", 0, 100)
    mem = got["ct200_gpu0_mem"]
    assert (mem.value, mem.uom, mem.max) == (70000 * MIB, "B", TOTAL_MIB * MIB)
    assert len([k for k in got if k.startswith("ct200_gpu")]) == 16
    assert not [k for k in got if k.startswith("ct202")]  # unreachable: no data, not zero


def test_no_perfdata_without_a_report_worth_it() -> None:
    """An empty check still has the counts (all zero) on its status line."""
    report = CheckReport(3, ())
    out = parse_output("\n".join(with_perfdata(check.lines(report), report)))
    assert {i.label: i.value for i in out.perfdata}["targets"] == 0
    assert out.long_text == ()


@pytest.mark.parametrize(
    "bad",
    [
        "'a'=1;2;3;4;5;6",  # a sixth field
        "a=1e5",  # an exponent
        "'a'=1XB",  # no such unit
        "a=1;x",  # no range
        "'a'=1 'b'=",  # no value
        "'a'=1,5",  # a locale's comma
    ],
)
def test_the_reader_refuses_what_the_guidelines_refuse(bad: str) -> None:
    with pytest.raises(FormatError):
        parse_perfdata(bad)


def test_the_reader_takes_the_guidelines_examples() -> None:
    """check_load's and the guidelines' own shapes."""
    items = parse_perfdata("load1=5.200;50.000;80.000;0; 'a b''s'=0%;@10:20;~:5 x=1c")
    assert [(i.label, i.value, i.uom) for i in items] == [
        ("load1", 5.2, ""),
        ("a b's", 0, "%"),
        ("x", 1, "c"),
    ]
