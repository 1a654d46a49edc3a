"""``orch kernel LOG``: a saved host kernel log (journalctl -k / dmesg text) as the host
observer's events; typer glue only (the work: orchestrator/agent/savedlog.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.commands._app import app, print_json


@app.command("kernel")
def kernel_cmd(
    logfile: Path = typer.Argument(
        ..., help="A saved `journalctl -k` or `dmesg` text (any -o short* / -T / iso form)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"log": PATH, "events": [{"kind", "xid", "pci", ...}]}.'
    ),
    boot_time: float | None = typer.Option(
        None,
        "--boot-time",
        help="Unix time the boot began: dates dmesg's seconds-since-boot stamps.",
    ),
) -> None:
    """Parse a saved host kernel log into the events the host observer reports.

    Each event: kind (xid, sxid, fallen-off-bus, oom-killer, link-down), xid, pci, the
    MIG gpu_instance / compute_instance of an Xid, the owner vmid (a guest's Proxmox port:
    veth, tap, fwbr, fwln, fwpr; an OOM victim's memory cgroup), the device, the time.
    A guest's ports being added or removed (its start or stop) are no link-down. Exit
    codes: 0 whether or not there were events; 2 for an unreadable file.
    """
    from orchestrator.agent.savedlog import read_saved_log
    from orchestrator.errors import UsageError
    from orchestrator.views.kernellog import format_events

    try:
        events = read_saved_log(logfile, boot_time=boot_time)
    except OSError as exc:
        raise UsageError(f"{logfile}: cannot read: {exc.strerror or exc}") from None
    if as_json:
        print_json({"log": str(logfile), "events": [e.to_dict() for e in events]})
    else:
        print(format_events(events, str(logfile)))
