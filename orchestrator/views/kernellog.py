"""``orch kernel``'s text: one line per kernel event (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.detect.base import fmt_time
from orchestrator.detect.host import where_on_gpu
from orchestrator.wire.model import KernelEvent


def format_event(e: KernelEvent) -> str:
    """One event as a line: time, kind, what it names, its owner.

    >>> format_event(KernelEvent("xid", "l", xid=43, pci="0000:3b:00", gpu_instance=2,
    ...                          compute_instance=1, pid=9, process="python3"))
    '-  xid 43  0000:3b:00 GPU-I:02 GPU-CI:01  pid 9 (python3)  host-wide'
    >>> format_event(KernelEvent("link-down", "l", device="fwpr201p0", vmid=201))
    '-  link-down  fwpr201p0  guest 201'
    """
    parts = [fmt_time(e.at) if e.at is not None else "-"]
    parts.append(f"{e.kind} {e.xid}" if e.xid is not None else e.kind)
    if e.pci:
        parts.append(where_on_gpu(e))
    if e.device:
        parts.append(e.device)
    if e.pid is not None:
        parts.append(f"pid {e.pid}" + (f" ({e.process})" if e.process else ""))
    parts.append(f"guest {e.vmid}" if e.vmid is not None else "host-wide")
    return "  ".join(parts)


def format_events(events: Sequence[KernelEvent], source: str) -> str:
    """All events of ``source``, or a line saying there were none."""
    if not events:
        return f"{source}: no kernel events (Xid, SXid, fallen off the bus, OOM killer, link down)"
    return "\n".join(format_event(e) for e in events)
