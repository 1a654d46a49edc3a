"""``orch postmortem``: collect the evidence of a run, reach a verdict, write a bundle (reads state).

This module is the I/O half. Evidence (:func:`collect`), all reads bounded: the
agent's ``evidence`` command (manifest, exit status, ``stop_requested``, the
log's last lines read from the end, the last pane screen kept by
``remain-on-exit``, the flight recorder's ``gpu.jsonl``, ``metrics.jsonl``),
one ``snapshot`` (the GPUs and processes now), and from the Proxmox host
``pct status``, the kernel log since the launch and its parsed events
(:meth:`orchestrator.remote.target.Host.probe`). The bundle (:func:`write_bundle`).

Judgement is pure and lives in :mod:`orchestrator.postmortem.verdict` (history
reconstruction, OOM matching, :func:`~orchestrator.postmortem.verdict.decide` and its
precedence); its public names are re-exported here. Alive with no problem is
``healthy`` (nothing to explain; the CLI exits 1).

Secrets: every text that leaves the container is redacted with the container's
secret-looking ``env`` values, and the manifest's env is masked again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.agent.kernel import VOLATILE_NOTE, is_volatile
from orchestrator.config.inventory import Inventory
from orchestrator.errors import AgentError, AgentRefused, Refused, UsageError
from orchestrator.postmortem.evidence import (
    Evidence,
    checked_records,
    final_snapshot,
    reconstruct_history,
)
from orchestrator.postmortem.verdict import (
    HEALTHY,
    OOM_WINDOW_S,
    STOPPED,
    Postmortem,
    Verdict,
    decide,
    died_at,
    judge,
    our_oom_kills,
    run_pids_and_names,
)
from orchestrator.wire import paths
from orchestrator.wire.answers import EvidenceAnswer
from orchestrator.wire.formats import parse_pct_status, utc_stamp
from orchestrator.wire.model import HostProbe, RunManifest, SchemaError, Snapshot
from orchestrator.wire.requests import EvidenceRequest
from orchestrator.wire.secrets import mask_env, redact, redact_tree, secret_values

__all__ = [
    "HEALTHY",
    "OOM_WINDOW_S",
    "STOPPED",
    "Evidence",
    "Postmortem",
    "Verdict",
    "collect",
    "decide",
    "default_bundle_dir",
    "died_at",
    "final_snapshot",
    "judge",
    "our_oom_kills",
    "postmortem",
    "reconstruct_history",
    "run_pids_and_names",
    "write_bundle",
]

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
PANE_LINES = 200
KERNEL_LOG_LINES = 2000
KERNEL_MARGIN_S = 120.0
"""The kernel log is read from this long before the launch (clock skew, the kill's lead-up)."""

# --- collect (I/O) ---------------------------------------------------------------------------


def _host_run(transport: Any, argv: list[str], timeout: float = 30.0) -> tuple[bool, str]:
    res = transport.run(argv, timeout=timeout)
    return res.ok, res.out if res.ok else (res.err or res.out)


PREVIOUS_BOOT = "-- the boot before this one (journalctl -k -b -1) --"
THIS_BOOT = "-- this boot (journalctl -k) --"
"""The lines that part the two boots in the bundle's kernel.log, after a host reboot."""


def _kernel_log(transport: Any, since: float) -> tuple[list[str], str | None, bool, bool]:
    """The host kernel log since ``since`` (last :data:`KERNEL_LOG_LINES` lines of each boot):
    journalctl, else dmesg; the boot before this one too when it has lines since ``since``
    (the host rebooted after the run started). Returns (lines, tool, previous boot read,
    volatile journal: no boot before this one is kept, ``-b -1`` said so on stderr)."""
    argv = [
        "journalctl",
        "-k",
        "-o",
        "short-unix",
        "--no-pager",
        "-q",
        f"--since=@{int(since)}",
        "-n",
        str(KERNEL_LOG_LINES),
    ]
    ok, text = _host_run(transport, argv)
    if ok:
        lines = text.splitlines()
        prev = transport.run([*argv, "-b", "-1"], timeout=30.0)  # "No journal boot entry..."
        if prev.ok and is_volatile(prev.err or ""):
            return lines, "journalctl", False, True
        earlier = [x for x in prev.out.splitlines() if x.strip()] if prev.ok else []
        if earlier:
            return [PREVIOUS_BOOT, *earlier, THIS_BOOT, *lines], "journalctl", True, False
        return lines, "journalctl", False, False
    ok, text = _host_run(transport, ["dmesg"])
    if ok:
        return text.splitlines()[-KERNEL_LOG_LINES:], "dmesg", False, False
    return [], None, False, False


def collect(
    inventory: Inventory,
    name: str,
    *,
    run_id: str | None = None,
    log_lines: int = LOG_TAIL_LINES,
    target: Any = None,
) -> Evidence:
    """Gather the evidence for ``run_id`` (default: ``runs/current``) of container ``name``.

    Raises:
        UsageError: ``run_id`` does not exist (exit 2).
        TransportError: the host or container cannot be reached (exit 3).
    """
    from orchestrator.remote.target import Host, Target
    from orchestrator.transport.connect import host_transport

    tgt = target or Target(inventory, name)
    c = tgt.container
    secrets = secret_values(c.env)
    errors: list[str] = []
    status, pct_text = ("running", "local target: no pct\n") if c.is_local else (None, "")
    host_tp = None
    if not c.is_local:
        host_tp = host_transport(inventory, c.host)
        ok, pct_text = _host_run(host_tp, ["pct", "status", str(c.vmid)])
        status = parse_pct_status(pct_text) if ok else "unknown"
        if not ok:
            errors.append(f"pct status {c.vmid}: {pct_text.strip()[:200]}")
    answer: EvidenceAnswer | None = None
    final: Snapshot | None = None
    if status == "running":
        req = EvidenceRequest(
            c.workdir, c.session, run_id=run_id or None, log_lines=log_lines, pane_lines=PANE_LINES
        )
        try:
            answer = tgt.call(req, timeout=60.0)
        except AgentRefused as exc:
            if exc.kind == "no-run" and run_id:
                raise UsageError(f"{name}: {exc.said}; see orch runs {name}") from None
            errors.append(f"evidence: {exc.said or exc.kind}")
        try:
            final = tgt.snapshot(timeout=60.0)
        except AgentError as exc:
            errors.append(f"snapshot: {exc}")
    else:
        errors.append(
            f"container {c.vmid} is {status}: its files cannot be read until it runs "
            f"(pct start {c.vmid})"
        )
    manifest = _manifest(answer.manifest if answer else None, secrets, errors)
    started = manifest.started_at if manifest else None
    probe: HostProbe | None = None
    kernel: list[str] = []
    source = None
    rebooted = volatile = False
    if host_tp is not None:
        since = (started or time.time() - 3600.0) - KERNEL_MARGIN_S
        kernel, source, rebooted, volatile = _kernel_log(host_tp, since)
        try:
            probe = Host(inventory, c.host).probe(since, previous_boot=rebooted)
        except (AgentError, OSError) as exc:
            errors.append(f"host probe: {exc}")
    ev = _evidence(
        name, answer, manifest, final, status, pct_text, probe, kernel, source, secrets, errors
    )
    note = VOLATILE_NOTE if volatile else None
    return dataclasses.replace(ev, vmid=c.vmid, previous_boot=rebooted, kernel_log_note=note)


def _manifest(raw: Any, secrets: Sequence[str], errors: list[str]) -> RunManifest | None:
    if not isinstance(raw, dict):
        return None
    try:
        m = RunManifest.from_dict(raw)
    except (SchemaError, TypeError, ValueError) as exc:
        errors.append(f"manifest.json: {exc}")
        return None
    return dataclasses.replace(m, env=mask_env(m.env), command=redact(m.command, secrets))


_AGENT_KEYS = (
    "run_id",
    "run_dir",
    "current",
    "session",
    "state",
    "tmux_server_running",
    "pane",
    "heartbeat",
    "files",
    "manifest_error",
    "stop_requested",
    "tee",
)
"""The parts of the agent's evidence document kept as ``Evidence.agent`` (state.json)."""


def _evidence(
    name: str,
    answer: EvidenceAnswer | None,
    manifest: RunManifest | None,
    final: Snapshot | None,
    status: str | None,
    pct_text: str,
    probe: HostProbe | None,
    kernel: list[str],
    source: str | None,
    secrets: Sequence[str],
    errors: list[str],
) -> Evidence:
    if answer is None:
        return Evidence(
            target=name,
            collected_at=time.time(),
            manifest=manifest,
            container_status=status,
            pct_status_text=pct_text,
            kernel_log=tuple(redact(x, secrets) for x in kernel),
            kernel_log_source=source,
            probe=probe,
            final=final,
            errors=tuple(redact(e, secrets) for e in errors),
        )
    state, log_tail, stop = answer.state, answer.log, answer.stop_requested
    pids = {*state.command_pids, *(p for p in (answer.pgid, answer.wrapper_pid) if p is not None)}
    tee_error = answer.tee.error
    doc = answer.to_dict()
    metrics, bad = checked_records(answer.metrics)
    if bad:
        errors = [*errors, bad]
    return Evidence(
        target=name,
        collected_at=answer.now,
        run_id=answer.run_id,
        run_dir=answer.run_dir,
        manifest=manifest,
        container_status=status,
        pct_status_text=pct_text,
        exit_status=answer.exit_status,
        exit_status_at=answer.exit_status_at,
        run_state=state.state,
        log_tail=tuple(redact(x, secrets) for x in log_tail.tail),
        log_exists=log_tail.exists,
        log_mtime=log_tail.mtime,
        log_size_bytes=log_tail.size_bytes,
        pane=tuple(redact(x, secrets) for x in answer.pane.lines),
        gpu_history=answer.gpu_history,
        metrics=metrics,
        kernel_log=tuple(redact(x, secrets) for x in kernel),
        kernel_log_source=source,
        probe=probe,
        final=final,
        run_pids=tuple(sorted(pids)),
        agent=redact_tree({k: doc.get(k) for k in _AGENT_KEYS}, secrets),
        errors=tuple(redact(e, secrets) for e in errors),
        stop_requested_at=stop.at if stop else None,
        stop_requested_by=redact(stop.by, secrets) if stop and stop.by else None,
        stop_signal=stop.signal if stop else None,
        tee_error=redact(tee_error, secrets)[:2000] if tee_error else None,
    )


# --- bundle (I/O) ----------------------------------------------------------------------------


def default_bundle_dir(ev: Evidence, now: float | None = None) -> Path:
    """``<state>/postmortems/<target>-<run>-<UTC stamp>/``."""
    stamp = utc_stamp(now)
    return paths.state_dir() / "postmortems" / f"{ev.target}-{ev.run_id or 'none'}-{stamp}"


Report = Callable[[Postmortem], tuple[str, str]]
"""``report(pm) -> (report.md, report.html)``: the view's rendering, handed in by the caller
(``orchestrator.views.postmortem``; this layer never imports the views)."""


def write_bundle(pm: Postmortem, out: Path | str | None = None, *, report: Report) -> Postmortem:
    """Write the raw files, findings.json, report.md and report.html (``report``'s); 0700 dir,
    0600 files.

    Raises:
        Refused: ``out`` exists and is not empty (a bundle is never overwritten; exit 4).
    """
    ev = pm.evidence
    target = Path(out).expanduser() if out else default_bundle_dir(ev)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise Refused(f"{target}: exists and is not empty; choose another --out")
    paths.ensure_private_dir(target)
    pm = dataclasses.replace(pm, bundle=str(target))
    manifest = ev.manifest.to_dict() if ev.manifest else {"error": "no manifest"}
    files: dict[str, str] = {
        "manifest.json": json.dumps(manifest, indent=2) + "\n",
        "exit_status": f"{ev.exit_status}\n" if ev.exit_status is not None else "missing\n",
        "log-tail.txt": "".join(f"{x}\n" for x in ev.log_tail),
        "pane.txt": "".join(f"{x}\n" for x in ev.pane),
        "gpu.jsonl": "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in ev.gpu_history),
        "kernel.log": "".join(f"{x}\n" for x in ev.kernel_log),
        "pct-status.txt": ev.pct_status_text,
        "findings.json": json.dumps(pm.to_dict(), indent=2, default=str) + "\n",
        "state.json": json.dumps(ev.agent, indent=2, default=str) + "\n",
    }
    if ev.metrics:
        files["metrics.jsonl"] = "".join(json.dumps(r) + "\n" for r in ev.metrics)
    files["report.md"], files["report.html"] = report(pm)
    for fname, text in files.items():
        paths.write_private(target / fname, text)
    return pm


def postmortem(
    inventory: Inventory,
    name: str,
    *,
    run_id: str | None = None,
    out: Path | str | None = None,
    write: bool = True,
    report: Report | None = None,
    db_path: Path | None = None,
) -> Postmortem:
    """Collect, judge and (by default) write the bundle, with ``report``'s rendering, for
    ``name``'s run; with the restart journal's entries about it (``db_path``, default the
    history database)."""
    from orchestrator.monitor.history import read_journal

    c = inventory.container(name)
    ev = collect(inventory, name, run_id=run_id)
    pm = judge(ev, limits=c.limits, roles=c.roles_by_gpu)
    if ev.run_id:
        mine = read_journal([name], db_path, limit=200, inventory=inventory)[name]
        about = [e for e in mine if ev.run_id in (e.run_id, e.new_run_id)]
        pm = dataclasses.replace(pm, restarts=tuple(about))
    if not write:
        return pm
    if report is None:
        raise ValueError("postmortem(write=True) needs report=, the view's rendering")
    return write_bundle(pm, out, report=report)
