"""``orch check``'s Nagios performance data (pure): what Nagios, Icinga and their graphers
(PNP4Nagios, nagiosgraph, Graphite writers) store and draw.

The format is the Monitoring Plugins development guidelines' (monitoring-plugins.org
doc/guidelines.html, "Performance data"; the same in Icinga's developer guidelines,
304-performance-data-metrics): ``'label'=value[UOM];[warn];[crit];[min];[max]``, items
apart by spaces, trailing empty fields dropped; value, min and max in ``[-0-9.]`` (no
exponent); warn and crit in the guidelines' range format (``10:`` alerts below 10, ``0``
alerts above 0); UOM one of none, ``s``, ``%``, ``B``, ``c``. Labels are always quoted and
keep only ``[A-Za-z0-9_.:/-]`` (never ``=`` or ``'``; no spaces, which Graphite splits on).

Where it goes is the Nagios plugin API's (Nagios Core 4 docs, "Plugin API", multiple lines
of output): the counts after ``|`` on the status line; the per-target and per-GPU items
after a ``|`` once the text lines end, one a line, so a fleet of many GPUs never stretches
the first line past what a core keeps of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.limits import Limits
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.sweep import CheckReport
from orchestrator.wire.model import Severity

MIB = 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]+")


@dataclass(frozen=True, slots=True)
class Perf:
    """One performance data item; ``warn``/``crit`` are ranges in the guidelines' format."""

    label: str
    value: float
    uom: str = ""
    warn: str = ""
    crit: str = ""
    min: float | None = None
    max: float | None = None

    def __str__(self) -> str:
        """``'label'=value[UOM];warn;crit;min;max`` with the empty tail dropped.

        >>> str(Perf("targets_critical", 1, crit="0", min=0))
        "'targets_critical'=1;;0;0"
        >>> str(Perf("ct200_gpu3_util", 100.0, "%", min=0, max=100))
        "'ct200_gpu3_util'=100%;;;0;100"
        """
        fields = [
            f"{quote(self.label)}={number(self.value)}{self.uom}",
            self.warn,
            self.crit,
            "" if self.min is None else number(self.min),
            "" if self.max is None else number(self.max),
        ]
        while fields[-1] == "":
            fields.pop()
        return ";".join(fields)


def quote(label: str) -> str:
    """``label`` made safe and single-quoted: runs of anything but ``[A-Za-z0-9_.:/-]``
    (``=``, ``'``, spaces, control characters) become one ``_``.

    >>> quote("ct200"), quote("it's = 2"), quote("job/node 1")
    ("'ct200'", "'it_s_2'", "'job/node_1'")
    """
    return "'" + (_UNSAFE.sub("_", label).strip("_") or "_") + "'"


def number(v: float) -> str:
    """A value in the guidelines' ``[-0-9.]``: integers without a point, others to three
    decimals, never an exponent.

    >>> number(73400320000.0), number(21500), number(2.5), number(0.0001), number(-1.25)
    ('73400320000', '21500', '2.5', '0', '-1.25')
    """
    if float(v).is_integer():
        return str(int(v))
    text = f"{v:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def counts(report: CheckReport) -> list[Perf]:
    """The status line's items: targets by their worst finding (unknown: unreachable) and
    the warning-or-worse findings, as the status line counts them."""
    ok = warning = critical = unknown = 0
    for r in report.targets:
        worst = max((f.severity for f in r.findings), default=Severity.INFO)
        if not r.snapshot.reachable:
            unknown += 1
        elif worst >= Severity.CRITICAL:
            critical += 1
        elif worst >= Severity.WARNING:
            warning += 1
        else:
            ok += 1
    judged = [*report.targets, *report.hosts]
    own = [f for jj in report.jobs for f in jj.findings]
    findings = [f for r in judged for f in r.findings] + own
    flagged = [f for f in findings if f.severity >= Severity.WARNING]
    return [
        Perf("targets", len(report.targets), min=0),
        Perf("targets_ok", ok, min=0),
        Perf("targets_warning", warning, warn="0", min=0),
        Perf("targets_critical", critical, crit="0", min=0),
        Perf("targets_unknown", unknown, min=0),
        Perf("findings", len(flagged), min=0),
        Perf("findings_critical", sum(f.severity >= Severity.CRITICAL for f in flagged), min=0),
    ]


def target_items(r: Judgement, limits: Limits) -> list[Perf]:
    """One reachable target's items: tokens/s (warn under ``min_tokens_per_s`` when set),
    the run's free disk in bytes (warn/crit under ``min_free_disk_gib`` /
    ``critical_free_disk_gib``), and per GPU utilisation (%) and memory used (bytes, max the
    GPU's total). An unreachable target has none: no data is not zero.

    >>> from orchestrator.wire.model import GpuSample, Metrics, Snapshot
    >>> s = Snapshot("ct200", 1.0, gpus=(GpuSample(3, utilization_pct=100.0, memory_used_mib=0.0,
    ...              memory_total_mib=1.0),), metrics=Metrics(tokens_per_s=21500.0))
    >>> print(" ".join(map(str, target_items(Judgement("ct200", s, "running"), Limits()))))
    'ct200_tokens_per_s'=21500;;;0 'ct200_gpu3_util'=100%;;;0;100 'ct200_gpu3_mem'=0B;;;0;1048576
    """
    snap = r.snapshot
    if not snap.reachable:
        return []
    out = []
    m = snap.metrics
    if m is not None and m.tokens_per_s is not None:
        floor = limits.min_tokens_per_s
        out.append(
            Perf(
                f"{r.name}_tokens_per_s",
                m.tokens_per_s,
                warn="" if floor is None else f"{number(floor)}:",
                min=0,
            )
        )
    run = snap.run
    if run is not None and run.disk_free_mib is not None:
        total = run.disk_total_mib
        out.append(
            Perf(
                f"{r.name}_disk_free",
                run.disk_free_mib * MIB,
                "B",
                warn=f"{number(limits.min_free_disk_gib * 1024 * MIB)}:",
                crit=f"{number(limits.critical_free_disk_gib * 1024 * MIB)}:",
                min=0,
                max=None if total is None else total * MIB,
            )
        )
    for g in snap.gpus:
        if g.utilization_pct is not None:
            out.append(Perf(f"{r.name}_gpu{g.index}_util", g.utilization_pct, "%", min=0, max=100))
        if g.memory_used_mib is not None:
            total = g.memory_total_mib
            out.append(
                Perf(
                    f"{r.name}_gpu{g.index}_mem",
                    g.memory_used_mib * MIB,
                    "B",
                    min=0,
                    max=None if total is None else total * MIB,
                )
            )
    return out


def with_perfdata(
    lines: Sequence[str], report: CheckReport, limits: Mapping[str, Limits] | None = None
) -> list[str]:
    """``lines`` (the status line first) with the performance data in the plugin API's
    places; a ``|`` inside the text (a finding's summary) becomes ``/``, or a core would
    take the rest of that line for performance data. ``limits``: each target's, by name
    (default: the defaults).
    """
    limits = limits or {}
    text = [line.replace("|", "/") for line in lines] or [""]
    out = [f"{text[0]} | " + " ".join(map(str, counts(report))), *text[1:]]
    items = [p for r in report.targets for p in target_items(r, limits.get(r.name, Limits()))]
    if items:
        out.append(f"| {items[0]}")
        out.extend(map(str, items[1:]))
    return out
