"""Reading runs (changes nothing): ``orch runs``, ``orch logs`` (tail or follow by byte offset),
``orch status`` (one row per target) and ``orch attach``'s command line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator import __version__
from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.errors import (
    AgentRefused,
    ContainerNotFound,
    OrchError,
    UsageError,
)
from orchestrator.lifecycle.preflight import container_status
from orchestrator.remote.target import Target
from orchestrator.wire.answers import LogAnswer, RunsAnswer, run_phase
from orchestrator.wire.model import Snapshot
from orchestrator.wire.progress_summary import metrics_progress
from orchestrator.wire.quoting import command_line, with_env
from orchestrator.wire.requests import LaunchRequest, LogsRequest, RunRequest, RunsRequest


def runs(inventory: Inventory, name: str, *, target: Target | None = None) -> RunsAnswer:
    """Every run in the container's workdir with its state and log size."""
    tgt = target or Target(inventory, name)
    try:
        return tgt.call(RunsRequest(tgt.container.workdir, tgt.container.session))
    except AgentRefused as exc:
        raise UsageError(f"{name}: {exc.said}") from None


def logs(
    inventory: Inventory,
    name: str,
    *,
    lines: int = 50,
    run_id: str | None = None,
    target: Target | None = None,
) -> LogAnswer:
    """The last ``lines`` lines of a run's log (read from the end, never the whole file)."""
    tgt = target or Target(inventory, name)
    try:
        return tgt.call(LogsRequest(tgt.container.workdir, run_id=run_id or None, lines=lines))
    except AgentRefused as exc:
        raise UsageError(f"{name}: {exc.said}") from None


def follow_logs(
    inventory: Inventory,
    name: str,
    *,
    lines: int = 50,
    run_id: str | None = None,
    target: Target | None = None,
    interval_s: float = 0.5,
) -> Iterator[LogAnswer]:
    """Chunks of new log lines over one long-lived agent command, by byte offset; ends after exit."""
    tgt = target or Target(inventory, name)
    req = LogsRequest(
        tgt.container.workdir, run_id=run_id or None, lines=lines, interval_s=interval_s
    )
    try:
        yield from tgt.follow(req)
    except AgentRefused as exc:
        raise UsageError(f"{name}: {exc.said}") from None


def status_one(inventory: Inventory, name: str) -> dict[str, Any]:
    """One row of ``orch status``: never raises; problems are in ``error``.

    ``state`` is the word ``watch`` and ``check`` show (:func:`views.state.target_state`);
    a vmid pct does not know is reachable, container ``missing``, state ``stopped``, as there.
    """
    row: dict[str, Any] = {
        "target": name,
        "reachable": False,
        "container": None,
        "error": None,
        "state": "unreachable",
    }
    try:
        tgt = Target(inventory, name)
        status_lock = (
            None if tgt.container.is_local else getattr(tgt.transport, "status_lock", None)
        )
        if status_lock is not None:  # pct's Lock too: a vzdump in stop mode is no plain "stopped"
            row["container"], row["lock"] = status_lock()
        else:
            row["container"] = container_status(tgt)
        if row["container"] != "running":
            row["reachable"], row["state"] = True, "stopped"
            return row
        snap = tgt.snapshot()
    except ContainerNotFound as exc:  # pct answered: the host is there, the container is not
        return {
            **row,
            "reachable": True,
            "container": "missing",
            "state": "stopped",
            "error": str(exc),
        }
    except OrchError as exc:
        row["error"] = str(exc)
        return row
    row["reachable"] = snap.reachable
    return {**row, **summarize(snap, tgt.container)}


def summarize(snap: Snapshot, container: ContainerConfig) -> dict[str, Any]:
    """The status columns from one snapshot (pure)."""
    from orchestrator.monitor.state import target_state

    sess = snap.session
    run = snap.run
    started = run.manifest.started_at if run and run.manifest else None
    gpus = [g for g in snap.gpus if not container.gpu_indices or g.index in container.gpu_indices]
    used = sum(g.memory_used_mib or 0.0 for g in gpus)
    total = sum(g.memory_total_mib or 0.0 for g in gpus)
    run_state = None
    if run is not None:  # the run directory's word (answers.run_phase), from what the snapshot saw
        live = bool(sess and sess.exists and sess.pane_dead is False)
        run_state = run_phase(run.exit_status, live)
        run_state = f"exited {run.exit_status}" if run_state == "exited" else run_state
    return {
        "session": None
        if sess is None
        else (
            "live"
            if sess.exists and sess.pane_dead is False
            else "dead pane"
            if sess.exists
            else "none"
        ),
        "run_id": run.run_id if run else None,
        "run_state": run_state,
        "state": target_state(snap, startup_grace_s=container.limits.startup_grace_s),
        "age_s": round(snap.taken_at - started, 1) if started else None,
        "step": snap.metrics.step if snap.metrics else None,
        "tokens_per_s": snap.metrics.tokens_per_s if snap.metrics else None,
        "progress": metrics_progress(snap.metrics),
        "gpus": len(gpus),
        "gpu_mem_used_gib": round(used / 1024, 1),
        "gpu_mem_total_gib": round(total / 1024, 1),
        "gpus_busy": sum(
            1 for g in gpus if (g.memory_used_mib or 0) > container.limits.busy_mem_mib
        ),
        "errors": list(snap.errors),
    }


def status(inventory: Inventory, names: Sequence[str]) -> list[dict[str, Any]]:
    """``orch status``: every target queried concurrently, in the order given."""
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        return list(pool.map(lambda n: status_one(inventory, n), names))


def attach_argv(inventory: Inventory, name: str) -> list[str]:
    """The interactive command that attaches to the run's tmux session.

    Local: ``tmux attach -t =SESSION``. Remote: ``ssh -t`` to the host, then
    ``pct exec VMID -- tmux attach``, the remote part quoted by ``command_line``.
    """
    c = inventory.container(name)
    tmux = ["tmux", "attach-session", "-t", f"={c.session}"]
    if c.is_local:
        return tmux
    host = inventory.host_of(c)
    assert host is not None
    ssh = ["ssh", "-t", "-p", str(host.port), "-o", "StrictHostKeyChecking=yes"]
    if host.identity_file:
        ssh += ["-i", host.identity_file]
    if host.known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={host.known_hosts}"]
    if host.proxy_jump:
        ssh += ["-J", host.proxy_jump]
    dest = host.ssh_config if host.ssh_config and not host.address else host.address
    remote = ["pct", "exec", str(c.vmid), "--", *with_env(tmux, {"TERM": "xterm-256color"})]
    return [*ssh, f"{host.user}@{dest}", command_line(remote)]


def run_request(c: ContainerConfig, run_id: str, tail: int = 30) -> RunRequest:
    """``runs --run-id``: one run of ``c`` in detail, with its last ``tail`` log lines."""
    return RunRequest(c.workdir, c.session, run_id=run_id, tail=tail)


def launch_request(
    c: ContainerConfig,
    command: str,
    run_id: str,
    gpus: Sequence[int],
    *,
    grace_s: float,
    settle_s: float,
    force: bool,
    target: str,
    carry_from: str | None = None,
    env_from: str | None = None,
) -> LaunchRequest:
    """The agent's ``launch`` of ``command`` as run ``run_id`` on ``gpus`` in ``c`` (both launchers)."""
    return LaunchRequest(
        c.workdir,
        command,
        c.session,
        run_id=run_id,
        gpus=",".join(str(g) for g in gpus),
        force=force,
        grace_s=grace_s,
        settle_s=settle_s,
        orch_version=__version__,
        target=target,
        env_from=env_from or None,
        carry_from=carry_from or None,
    )
