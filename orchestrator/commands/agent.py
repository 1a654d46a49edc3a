"""Agent commands: ``orch facts`` and ``orch snapshot`` (one agent call each)."""

from __future__ import annotations

import typer

from orchestrator.commands._app import app, load_inventory, out_console, print_json
from orchestrator.wire.text import visible


@app.command("facts")
def facts_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml (or 'local')."),
    torch: bool = typer.Option(
        False, "--torch", help="Also time `import torch` and what CUDA it sees."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON."),
) -> None:
    """What a container offers: python, tmux, NVML driver, GPUs, free disk, tmux sessions.

    Deploys the agent first if needed. Exit codes: 0 ok, 1 agent failed, 2 bad
    input, 3 unreachable.
    """
    from orchestrator.remote.target import Target

    facts = Target(load_inventory(), target).facts(torch=torch)
    if as_json:
        print_json(facts)
        return
    nvml = facts.get("nvml") or {}
    gpu_text = ", ".join(f"{g['index']}:{g.get('name') or '?'}" for g in facts.get("gpus") or [])
    out_console.print(
        f"[bold]{target}[/] python {facts['python']['version']}, "
        f"tmux {facts['tmux']['version'] or 'missing'}",
        highlight=False,
    )
    out_console.print(
        f"  NVML: {'ok' if nvml.get('ok') else nvml.get('error_kind')} "
        f"(driver {nvml.get('driver_version') or '?'}, via {nvml.get('source')})"
        + (f": {nvml.get('message')}" if not nvml.get("ok") else ""),
        highlight=False,
    )
    out_console.print(f"  GPUs: {gpu_text or 'none'}", highlight=False)
    out_console.print(
        f"  disk free: {facts['disk']['free_mib']} MiB at {facts['disk']['path']}", highlight=False
    )
    out_console.print(
        f"  tmux sessions: {', '.join(facts['tmux']['sessions']) or 'none'}", highlight=False
    )
    if "torch" in facts:
        out_console.print(f"  torch: {facts['torch']}", highlight=False)


@app.command("snapshot")
def snapshot_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml (or 'local')."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the snapshot as JSON (docs/snapshot.md)."
    ),
) -> None:
    """One observation of a container: tmux session, run, processes, GPUs, metrics.

    Exit codes: 0 ok, 1 agent failed or answered garbage, 2 bad input, 3 unreachable.
    """
    from orchestrator.remote.target import Target

    snap = Target(load_inventory(), target).snapshot()
    if as_json:
        print_json(snap.to_dict())
        return
    s, r, n = snap.session, snap.run, snap.nvml
    if s is not None:
        state = (
            "missing"
            if not s.exists
            else f"dead (status {s.pane_dead_status}, signal {s.pane_dead_signal})"
            if s.pane_dead
            else "alive"
        )
        out_console.print(
            f"session {visible(s.name)}: {state}"
            + ("" if s.server_running else " (no tmux server)"),
            highlight=False,
            markup=False,
        )
    if r is not None:
        out_console.print(
            f"run {visible(r.run_id)}: log {r.log_size_bytes if r.log_exists else 'missing'} "
            f"bytes, exit status {r.exit_status}",
            highlight=False,
            markup=False,
        )
    if n is not None and not n.ok:
        from rich.markup import escape

        out_console.print(
            f"[red]NVML {escape(visible(str(n.error_kind)))}[/]: {escape(visible(n.message or ''))}",
            highlight=False,
        )
    for g in snap.gpus:
        procs = len(g.processes) if g.processes is not None else "?"
        out_console.print(
            f"GPU {g.index}: "
            + (
                visible(g.error or "")
                or f"{g.utilization_pct} %, {g.memory_used_mib} / "
                f"{g.memory_total_mib} MiB, {g.power_w} W, {procs} processes"
            ),
            highlight=False,
            markup=False,
        )
    if snap.metrics is not None:
        m = snap.metrics
        rate = (
            f", throughput {m.throughput} {m.throughput_unit}" if m.throughput is not None else ""
        )
        out_console.print(
            f"metrics: step {m.step}, loss {m.loss}, tokens/s {m.tokens_per_s}{rate}",
            highlight=False,
        )
    if snap.cost is not None:
        out_console.print(
            f"agent cost: {snap.cost.cpu_ms} ms CPU, {snap.cost.bytes_read} bytes read",
            highlight=False,
        )
