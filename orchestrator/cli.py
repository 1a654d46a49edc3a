"""Typer glue only: parse flags, call the module that does the work, render, exit.

Every ``OrchError`` is handled here in one place: one red ``error:`` line on
stderr and the error's documented exit code. Anything else is a bug: its
traceback is shown with a line asking for a report.

Each command group lives in its own section below; the work itself lives in the
modules they call (launch.py, postmortem.py, views/...).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from orchestrator import __version__
from orchestrator.errors import OrchError

app = typer.Typer(
    name="orch",
    help="Launch, watch and explain training runs in Proxmox LXC containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err_console = Console(stderr=True)
out_console = Console()


class State:
    """Options given before the command (``orch -c hosts.yaml status``)."""

    config: Path | None = None
    verbose: int = 0


state = State()


def _version(value: bool) -> None:
    if value:
        print(f"orch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    config: Path | None = typer.Option(
        None,
        "-c",
        "--config",
        help="hosts.yaml to use (else $ORCH_CONFIG, ./hosts.yaml, ~/.config/orch/hosts.yaml).",
        envvar=None,
    ),
    verbose: int = typer.Option(
        0, "-v", "--verbose", count=True, help="More log output (-vv: debug)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    state.config = config
    state.verbose = verbose
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def load_inventory():  # type: ignore[no-untyped-def]
    """The inventory named by ``-c`` / ``$ORCH_CONFIG`` / the lookup order (config.py)."""
    from orchestrator.config import load_inventory as _load

    return _load(state.config)


# --- foundation: hosts, trust, sandbox -------------------------------------------------------


@app.command("hosts")
def hosts_cmd(
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON document instead of tables."
    ),
) -> None:
    """List the hosts and containers of the inventory (hosts.yaml, validated).

    Exit codes: 0 listed; 2 hosts.yaml is malformed (one line naming file:line and key).
    Env values whose names look secret are masked in --json output.
    """
    from orchestrator.config import config_search_paths, inventory_summary

    summary = inventory_summary(load_inventory())
    if as_json:
        print_json(summary)
        return
    from rich.table import Table
    from rich.text import Text

    if summary["config"] is None:
        looked = ", ".join(str(p) for p in config_search_paths())
        err_console.print(
            Text(
                f"no hosts.yaml found ($ORCH_CONFIG, {looked}); showing the built-in local target"
            ),
            soft_wrap=True,
        )
    hosts = Table("host", "address", "user", title=Text(f"hosts ({summary['config']})"))
    for h in summary["hosts"]:
        hosts.add_row(Text(h["name"]), Text(f"{h['address']}:{h['port']}"), Text(h["user"]))
    from orchestrator.config_reader import gpu_ranges

    cts = Table("container", "host", "address", "vmid", "session", "gpus")
    cts.add_column("workdir", overflow="fold")
    for c in summary["containers"]:
        gpus = " ".join(f"{role}:{gpu_ranges(ids)}" for role, ids in c["gpus"].items())
        cells = (c["name"], c["host"], c["address"], c["vmid"] or "-", c["session"], gpus or "-")
        cts.add_row(*(Text(str(v)) for v in cells), Text(c["workdir"]))
    if summary["hosts"]:
        out_console.print(hosts)
    out_console.print(cts)


@app.command("trust")
def trust_cmd(
    host: str = typer.Argument(..., help="Host name from hosts.yaml."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Record the key without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print the key and outcome as JSON."),
) -> None:
    """Show HOST's SSH host key fingerprint and record it in its known_hosts on confirmation.

    Compare the fingerprint with the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`
    on its console) before accepting. A key already recorded is left as is; a CHANGED key is
    refused until you remove the old known_hosts line yourself.

    Exit codes: 0 recorded or already known; 1 not confirmed; 2 no such host;
    3 unreachable, or the key changed (possible man-in-the-middle).
    """
    from orchestrator.errors import UsageError
    from orchestrator.transport import trust

    inventory = load_inventory()
    if host not in inventory.hosts:
        known = ", ".join(sorted(inventory.hosts)) or "none"
        raise UsageError(f"no host named {host!r} in the inventory (known: {known})")
    scanned = trust.scan(inventory.hosts[host])
    outcome = scanned.status
    if scanned.status == trust.UNKNOWN:
        sys.stderr.write(
            f"{host} ({scanned.address}:{scanned.port}) presents a {scanned.key_type} key\n"
            f"  fingerprint {scanned.fingerprint}\n"
        )
        if yes or typer.confirm(f"record it in {scanned.known_hosts}?", err=True):
            trust.record(scanned)
            outcome = "added"
        else:
            outcome = "declined"
    elif scanned.status == trust.CHANGED:
        trust.record(scanned)  # raises HostKeyChanged: refused
    if as_json:
        print_json({**scanned.to_dict(), "outcome": outcome})
    elif outcome == "known":
        print(f"{host}: key {scanned.fingerprint} is already in {scanned.known_hosts}")
    elif outcome == "added":
        print(f"{host}: recorded {scanned.key_type} {scanned.fingerprint} in {scanned.known_hosts}")
    if outcome == "declined":
        sys.stderr.write(f"{host}: not recorded\n")
        raise typer.Exit(1)


sandbox_app = typer.Typer(
    help="A simulated Proxmox host on this machine: real sshd, pct stand-in, fake NVML.",
    no_args_is_help=True,
)
app.add_typer(sandbox_app, name="sandbox")
_SANDBOX_DIR_HELP = "State directory (default ~/.local/state/orch/sandbox); several can coexist."


@sandbox_app.command("up")
def sandbox_up(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    containers: int = typer.Option(1, "--containers", help="Containers ct200, ct201, ... (1-50)."),
    gpus: int = typer.Option(8, "--gpus", help="Simulated GPUs (1-64)."),
    scenario: str = typer.Option(
        "healthy", "--scenario", help="Bundled scenario name or JSON file."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"config": ..., "state_dir": ..., ...}.'
    ),
) -> None:
    """Start a sandbox (as the current user) and print its hosts.yaml path.

    Then try: orch -c <config> hosts. Exit codes: 0 running (also when it already ran);
    1 something failed to start; 2 a needed tool (tmux, sshd, cc) is missing or a flag is bad.
    """
    from orchestrator.sandbox import manager

    info = manager.up(state_dir, containers=containers, gpus=gpus, scenario=scenario)
    if as_json:
        print_json(info.to_dict())
        return
    print(
        f"sandbox up: sshd on 127.0.0.1:{info.port}, containers {', '.join(info.containers)}, "
        f"{info.gpus} GPUs, scenario {info.scenario}"
    )
    print(f"config: {info.config_path}")
    print(f"try: orch -c {info.config_path} hosts")


@sandbox_app.command("down")
def sandbox_down(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
) -> None:
    """Stop everything the sandbox started (by pid); run logs and the state directory stay.

    Exit codes: 0 stopped (or nothing ran); 1 no sandbox in that directory.
    """
    from orchestrator.sandbox import manager

    report = manager.down(state_dir)
    if as_json:
        print_json(report)
        return
    print(
        f"sandbox down: sshd {'stopped' if report['sshd'] else 'was not running'}, "
        f"containers stopped: {', '.join(report['containers']) or 'none'}"
    )


@sandbox_app.command("status")
def sandbox_status(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Show whether the sandbox runs, its port, scenario and containers.

    Exit codes: 0 running; 1 not running or no sandbox in that directory.
    """
    from orchestrator.sandbox import manager

    st = manager.status(state_dir)
    if as_json:
        print_json(st)
    else:
        print(
            f"sandbox {st['state_dir']}: {'running' if st['running'] else 'stopped'}, "
            f"port {st['port']}, scenario {st['scenario']}, {st['gpus']} GPUs"
        )
        for c in st["containers"]:
            print(
                f"  {c['name']} (vmid {c['vmid']}): {c['status']}, {c['processes']} processes, "
                f"workdir {c['workdir']}"
            )
    if not st["running"]:
        raise typer.Exit(1)


@sandbox_app.command("scenario")
def sandbox_scenario(
    name: str = typer.Argument(
        ..., help="healthy, idle, ghost, driver-mismatch, gpu-lost, gpu-hang, ... or a JSON file."
    ),
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
) -> None:
    """Switch the GPU scenario of a sandbox while things run (atomic; NVML re-reads it per call).

    Exit codes: 0 switched; 1 no sandbox there; 2 unknown scenario.
    """
    from orchestrator.sandbox import manager

    print(f"scenario: {manager.set_scenario(state_dir, name)}")


# --- agent -----------------------------------------------------------------------------------


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
    from orchestrator.target import Target

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
    from orchestrator.target import Target

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
            f"session {s.name}: {state}" + ("" if s.server_running else " (no tmux server)"),
            highlight=False,
        )
    if r is not None:
        out_console.print(
            f"run {r.run_id}: log {r.log_size_bytes if r.log_exists else 'missing'} bytes, "
            f"exit status {r.exit_status}",
            highlight=False,
        )
    if n is not None and not n.ok:
        out_console.print(f"[red]NVML {n.error_kind}[/]: {n.message}", highlight=False)
    for g in snap.gpus:
        procs = len(g.processes) if g.processes is not None else "?"
        out_console.print(
            f"GPU {g.index}: "
            + (
                g.error
                or f"{g.utilization_pct} %, {g.memory_used_mib} / "
                f"{g.memory_total_mib} MiB, {g.power_w} W, {procs} processes"
            ),
            highlight=False,
        )
    if snap.metrics is not None:
        m = snap.metrics
        out_console.print(
            f"metrics: step {m.step}, loss {m.loss}, tokens/s {m.tokens_per_s}", highlight=False
        )
    if snap.cost is not None:
        out_console.print(
            f"agent cost: {snap.cost.cpu_ms} ms CPU, {snap.cost.bytes_read} bytes read",
            highlight=False,
        )


# --- launch lifecycle ------------------------------------------------------------------------


@app.command("launch")
def launch_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    trainer_args: list[str] | None = typer.Argument(
        None,
        metavar="TRAINER_ARGS",
        help="After --: extra arguments for the bundled trainer, each quoted, after orch's "
        "--config/--run-dir (e.g. -- --steps 100 --fault crash@4; --config NAME|PATH "
        "replaces the default config). Not with --cmd or a hosts.yaml command.",
        show_default=False,
    ),
    cmd: str | None = typer.Option(
        None,
        "--cmd",
        help="Shell command to run (default: the container's command, else the bundled trainer).",
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPUs to use, e.g. 0-7 or 0,2 (default: the container's assignment)."
    ),
    env: list[str] = typer.Option([], "--env", metavar="K=V", help="Extra variable (repeatable)."),
    name: str | None = typer.Option(
        None, "--name", help="Suffix of the run id (YYYYmmdd-HHMMSS-NAME)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Stop a live session of the same name first (gracefully; its run directory is kept).",
    ),
    grace: float = typer.Option(60.0, "--grace", help="Seconds --force gives the old run."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Return once started."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON result document."),
) -> None:
    """Start a run in the container's tmux session and verify it came up.

    Without a command the bundled trainer runs, with hosts.yaml's
    trainer_config, else dflash-8gpu when GPUs are assigned (refused where
    torch sees fewer than 8 CUDA devices), else tiny-cpu. Extra trainer
    arguments follow --: orch launch ct200 -- --steps 100 --fault crash@4

    Exit codes: 0 verified; 1 the run died during startup (exit status, last log
    lines and diagnosis are printed) or stayed silent; 2 bad arguments; 3
    unreachable; 4 refused by preflight (live session, busy GPUs, disk, missing
    modules, too few CUDA devices for the config): nothing started.
    """
    from orchestrator import launch
    from orchestrator.views.launch import PhaseProgress, launch_summary

    inventory = load_inventory()
    progress = None if as_json else PhaseProgress(err_console)
    try:
        result = launch.launch(
            inventory,
            target,
            cmd=cmd,
            gpus=gpus,
            env=env,
            run_name=name,
            force=force,
            verify=not no_verify,
            grace_s=grace,
            on_phase=progress,
            trainer_args=trainer_args or (),
        )
    except launch.RunDied as exc:
        if as_json:
            print_json(
                {
                    "ok": False,
                    "error": "run-died",
                    "message": str(exc),
                    "exit_status": exc.exit_status,
                    "log_tail": exc.log_tail,
                    "diagnosis": exc.diagnosis,
                    "state": exc.state,
                }
            )
            raise typer.Exit(exc.exit_code) from None
        raise
    finally:
        if progress is not None:
            progress.close()
    if as_json:
        print_json(result.to_dict())
    else:
        launch_summary(out_console, result.to_dict())


@app.command("stop")
def stop_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    grace: float = typer.Option(
        60.0, "--grace", help="Seconds from SIGINT to SIGKILL (SIGTERM at half)."
    ),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the current run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Stop the run: SIGINT, then SIGTERM, then SIGKILL after --grace; idempotent.

    The tmux session and the run directory stay for the postmortem. Exit codes:
    0 stopped or already not running; 3 unreachable.
    """
    from orchestrator import launch

    doc = launch.stop(load_inventory(), target, grace_s=grace, run_id=run_id)
    if as_json:
        print_json(doc)
    elif doc.get("stopped"):
        out_console.print(
            f"stopped run {doc['run_id']} with {', '.join(doc['signals']) or 'no signal'} "
            f"in {doc['elapsed_s']:.1f} s: exit status {doc['exit_status']}",
            highlight=False,
        )
    else:
        code = doc.get("exit_status")
        state = f"exited {code}" if code is not None else doc.get("state")
        out_console.print(
            f"run {doc['run_id']} is not running ({state}); nothing to stop", highlight=False
        )


@app.command("logs")
def logs_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    follow: bool = typer.Option(
        False,
        "-f",
        "--follow",
        help="Keep printing new lines (by byte offset) until the run ends or Ctrl-C.",
    ),
    lines: int = typer.Option(50, "-n", "--lines", help="Lines from the end to show first."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the current run)."),
) -> None:
    """Show the end of the run's log (train.log), read from the end; -f follows it.

    Exit codes: 0 done; 2 no such run; 3 unreachable.
    """
    from orchestrator import launch

    inventory = load_inventory()
    if not follow:
        doc = launch.logs(inventory, target, lines=lines, run_id=run_id)
        for line in doc.get("lines", []):
            sys.stdout.write(line + "\n")
        return
    for chunk in launch.follow_logs(inventory, target, lines=lines, run_id=run_id):
        if chunk.get("truncated"):
            err_console.print("[yellow]log truncated; reading from the start[/]")
        for line in chunk.get("lines", []):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if chunk.get("end"):
            code = (chunk.get("state") or {}).get("exit_status")
            err_console.print(f"[dim]run ended: exit status {code}[/]", highlight=False)


@app.command("status")
def status_cmd(
    targets: list[str] = typer.Argument(None, help="Container names (default: all in hosts.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per target."),
) -> None:
    """One table of every target, queried concurrently: reachable, container, session, run,
    age, step, tokens/s, GPU memory. Exit codes: 0 (problems are shown, not raised); 2 bad name.
    """
    from orchestrator import launch
    from orchestrator.views.launch import status_table

    inventory = load_inventory()
    names = list(targets or [n for n in inventory.containers if n != "local"] or ["local"])
    for n in names:
        inventory.container(n)
    rows = launch.status(inventory, names)
    if as_json:
        print_json(rows)
    else:
        out_console.print(status_table(rows))


@app.command("runs")
def runs_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON."),
) -> None:
    """The runs in the container's workdir: running, exited N or vanished, and log sizes."""
    from orchestrator import launch
    from orchestrator.views.launch import runs_table

    doc = launch.runs(load_inventory(), target)
    if as_json:
        print_json(doc)
    else:
        out_console.print(runs_table(doc))


@app.command("attach")
def attach_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    print_only: bool = typer.Option(False, "--print", help="Only print the command."),
) -> int:
    """Attach to the run's tmux session (ssh -t, pct exec, tmux attach); detach with C-b d."""
    import subprocess

    from orchestrator import launch
    from orchestrator.transport.quoting import command_line

    argv = launch.attach_argv(load_inventory(), target)
    if print_only:
        print(command_line(argv))
        return 0
    return subprocess.call(argv)


# --- detection: diagnose, postmortem, playbook -----------------------------------------------

playbook_app = typer.Typer(help="List, show and run playbooks (failure signatures, procedures).")
app.add_typer(playbook_app, name="playbook")


@app.command()
def diagnose(
    logfile: Path = typer.Argument(
        ..., help="Any log file (ours or not); streamed, never loaded whole."
    ),
    as_json: bool = typer.Option(False, "--json", help='Print {"matches": [...]} best first.'),
    playbooks_dir: Path | None = typer.Option(
        None, "--playbooks", help="Playbook directory (default: bundled)."
    ),
) -> None:
    """Match a log against the signature playbooks, offline; best match first.

    Exit codes: 0 whether or not something matched (the answer is the output);
    2 for an unreadable log or a bad playbook file.
    """
    from orchestrator.errors import UsageError
    from orchestrator.playbooks import format_matches, iter_log_lines, load_playbooks, match_log

    pbs = load_playbooks(playbooks_dir)
    try:
        matches = match_log(iter_log_lines(logfile), pbs)
    except OSError as exc:
        raise UsageError(f"{logfile}: cannot read: {exc.strerror or exc}") from None
    if as_json:
        print_json({"log": str(logfile), "matches": [m.to_dict() for m in matches]})
    else:
        print(format_matches(matches, pbs, str(logfile)))


@app.command("postmortem")
def postmortem_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: runs/current)."),
    out: Path | None = typer.Option(
        None, "--out", help="Bundle directory (default: <state>/postmortems/<target>-<run>-<ts>/)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"verdict": {...}, "findings": [...], "bundle": DIR}.'
    ),
) -> None:
    """Explain a run: evidence, detectors and playbooks, a verdict, and a bundle directory.

    Collects the manifest, exit status, log tail, last pane screen, flight recorder
    (gpu.jsonl), host kernel log since the launch and pct status; writes them with
    report.md and report.html to the bundle (0700 dir, 0600 files). Verdict kinds:
    container-stopped, oom-killer, stopped (orch stop asked), log-signature (with
    its playbook), crashed, silent-death, ghost-utilization, finished, other
    findings of a live run, or
    healthy. Exit codes: 0 a verdict was reached; 1 the run is alive and healthy
    (nothing to explain; the bundle is still written); 2 unknown target or run;
    3 host or container unreachable; 4 --out exists and is not empty.
    """
    from orchestrator import postmortem
    from orchestrator.views.postmortem import print_verdict

    pm = postmortem.postmortem(load_inventory(), target, run_id=run_id, out=out)
    if as_json:
        print_json(pm.to_dict())
    else:
        print_verdict(out_console, pm)
    if not pm.verdict.reached:
        raise typer.Exit(1)


@playbook_app.command("list")
def playbook_list(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
    playbooks_dir: Path | None = typer.Option(
        None, "--playbooks", help="Playbook directory (default: bundled)."
    ),
) -> None:
    """List playbooks: id, kind, severity, title. Exit 0; 2 for a bad playbook file."""
    from orchestrator.playbooks import load_playbooks

    pbs = load_playbooks(playbooks_dir)
    if as_json:
        print_json(
            [
                {"id": p.id, "kind": p.kind, "severity": str(p.severity), "title": p.title}
                for p in pbs
            ]
        )
        return
    width = max(len(p.id) for p in pbs)
    for p in pbs:
        print(f"{p.id:<{width}}  {p.kind:<9}  {str(p.severity):<8}  {p.title}")


@playbook_app.command("show")
def playbook_show(
    playbook_id: str = typer.Argument(..., metavar="ID", help="Playbook id (orch playbook list)."),
    as_json: bool = typer.Option(False, "--json", help="Print the playbook as JSON."),
    playbooks_dir: Path | None = typer.Option(
        None, "--playbooks", help="Playbook directory (default: bundled)."
    ),
) -> None:
    """Show one playbook: match rules, diagnosis, remedy, steps. Exit 0; 2 for an unknown id."""
    from orchestrator.playbooks import get_playbook, load_playbooks

    pb = get_playbook(load_playbooks(playbooks_dir), playbook_id)
    if as_json:
        print_json(pb.to_dict())
        return
    print(f"{pb.id}: {pb.title}  [{pb.kind}, {pb.severity}]")
    for label, items in (("log", pb.log), ("findings", pb.findings), ("exit codes", pb.exit_codes)):
        if items:
            print(f"  match {label}: " + "  |  ".join(str(i) for i in items))
    print("\n" + pb.diagnosis.strip())
    if pb.remedy:
        print("\nRemedy:\n" + "\n".join(f"  - {r}" for r in pb.remedy))
    for i, s in enumerate(pb.steps, 1):
        what = f"action {s.action}" if s.action else " ".join(s.argv or ())
        print(f"  {i}. {s.name}{' (per GPU)' if s.foreach else ''}: {what}")
    if pb.references:
        print("\nReferences:\n" + "\n".join(f"  {r}" for r in pb.references))


@playbook_app.command("run")
def playbook_run(
    playbook_id: str = typer.Argument(..., metavar="ID", help="A procedure playbook id."),
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    yes: bool = typer.Option(False, "--yes", help="Act; without it only print the exact steps."),
    force: bool = typer.Option(
        False, "--force", help="With --yes: archive (rename aside) what a step would overwrite."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the plan (dry run) or the step results as JSON."
    ),
    playbooks_dir: Path | None = typer.Option(
        None, "--playbooks", help="Playbook directory (default: bundled)."
    ),
) -> None:
    """Run a procedure on TARGET: dry run by default (prints every exact command), --yes to act.

    --yes is consent to every printed step, including stopping the live run (SIGINT,
    log and exit status kept). A step that would overwrite an existing path (e.g.
    clean-env's venv) is refused unless --force, which renames it aside; nothing is
    ever deleted. Exit codes: 0 done (or dry run printed); 1 a step failed (earlier
    steps stay done); 2 unknown id or target, or not a procedure; 3 unreachable;
    4 refused (an existing path without --force, or the relaunch preflight refused).
    """
    from orchestrator.playbooks import get_playbook, load_playbooks
    from orchestrator.procedures import (
        format_plan,
        plan_procedure,
        procedure_context,
        run_procedure,
    )

    pb = get_playbook(load_playbooks(playbooks_dir), playbook_id)
    inventory = load_inventory()
    steps = plan_procedure(pb, procedure_context(inventory.container(target)))
    if not yes:
        if as_json:
            print_json({"playbook": pb.id, "target": target, "dry_run": True,
                        "steps": [s.to_dict() for s in steps]})  # fmt: skip
        else:
            print(format_plan(pb.id, target, steps))
        return
    results = run_procedure(
        steps, inventory, target, force=force, echo=(lambda _line: None) if as_json else print
    )
    if as_json:
        print_json({"playbook": pb.id, "target": target, "dry_run": False, "steps": results})
    else:
        print(f"{pb.id} on {target}: all {len(steps)} steps done")


# --- views: watch, check, export -------------------------------------------------------------


@app.command("watch")
def watch_cmd(
    targets: list[str] = typer.Argument(
        None, help="Containers to watch (default: all); one name opens its detail view."
    ),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between snapshots."),
    plain: bool = typer.Option(
        False,
        "--plain",
        help="One line per change instead of the full-screen view (automatic when stdout is not a terminal).",
    ),
) -> None:
    """Live dashboard of every target: state, run, step, tokens/s, GPUs by role, findings.

    Keys: q quits, up/down select, Enter opens a target's detail (GPUs, evidence,
    pane tail), Esc goes back. Exit code 0 on q or Ctrl-C.
    """
    from orchestrator.views.watch import watch

    raise typer.Exit(
        watch(
            load_inventory(), targets or [], interval_s=interval, plain=plain, console=out_console
        )
    )


@app.command("check")
def check_cmd(
    targets: list[str] = typer.Argument(
        None, help="Containers to check (default: all in hosts.yaml)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of lines."),
    notify: str | None = typer.Option(
        None,
        "--notify",
        metavar="URL",
        envvar="ORCH_WEBHOOK",
        show_envvar=True,
        help="Webhook for alerts (POST JSON with a Slack-compatible 'text'); $ORCH_WEBHOOK keeps the URL out of ps.",
    ),
    notify_cmd: str | None = typer.Option(
        None,
        "--notify-cmd",
        metavar="CMD",
        help="Command run with the alert JSON on stdin (split like a shell would, run without one).",
    ),
    renotify: float = typer.Option(
        4.0,
        "--renotify",
        metavar="HOURS",
        help="Repeat an alert still active after this many hours.",
    ),
    db: Path | None = typer.Option(
        None, "--db", help="History database (default $ORCH_DB or ~/.local/state/orch/orch.db)."
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        metavar="S",
        help="Seconds a target may take to answer before it counts as unreachable.",
    ),
    jobs: int = typer.Option(
        32, "--jobs", min=1, help="Targets snapshotted at once (1 = strictly sequential)."
    ),
    critical: list[str] = typer.Option(
        [],
        "--critical",
        metavar="KIND",
        help="Finding kind to page for as CRITICAL even when a detector rates it a warning (repeatable; default: none).",
    ),
) -> None:
    """One health check of every target, for cron and Nagios.

    Exit codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (no target answered, or the
    check could not run). One line per problem; alerts are deduplicated through the
    history database (new, changed severity, repeat after --renotify hours, recovery).
    """
    import shlex

    from orchestrator.views import check

    opts = check.CheckOptions(
        names=targets or [],
        db_path=db,
        timeout_s=timeout,
        workers=jobs,
        renotify_h=renotify,
        webhook_url=notify,
        notify_cmd=shlex.split(notify_cmd) if notify_cmd else None,
        critical_kinds=[k for k in critical if k != "none"],
    )
    try:  # a check that cannot run is UNKNOWN (3) to Nagios, whatever the cause
        inventory = load_inventory()
        report = check.run_check(inventory, opts)
    except OrchError as exc:
        if as_json:
            print_json({"status": "UNKNOWN", "targets": [], "problems": [str(exc)]})
        else:
            print(f"ORCH UNKNOWN - {exc}")
        raise typer.Exit(check.UNKNOWN) from None
    containers = [inventory.container(r.name) for r in report.targets]
    if as_json:
        print_json(check.redact_report(check.to_json(report), containers))
    else:
        text = "\n".join(check.lines(report, check.playbook_titles()))
        print(check.redact_report(text, containers), flush=True)
    raise typer.Exit(report.status)


@app.command("export")
def export_cmd(
    targets: list[str] = typer.Argument(None, help="Containers to export (default: all)."),
    listen: str | None = typer.Option(
        None, "--listen", metavar="HOST:PORT", help="Serve /metrics here, e.g. 127.0.0.1:9400."
    ),
    textfile: Path | None = typer.Option(
        None,
        "--textfile",
        metavar="PATH",
        help="Write node_exporter textfile metrics here (atomically).",
    ),
    interval: float | None = typer.Option(
        None,
        "--interval",
        metavar="S",
        help="Seconds between polls (default 15 with --listen; with --textfile alone: write once and exit).",
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", metavar="S", help="Seconds a target may take to answer."
    ),
) -> None:
    """Prometheus metrics: dcgm-exporter GPU names and labels plus orch_* run and health gauges."""
    from orchestrator.errors import UsageError
    from orchestrator.views import export
    from orchestrator.views.check import select_targets

    if not listen and not textfile:
        raise UsageError("orch export needs --listen HOST:PORT or --textfile PATH")
    if listen:
        try:
            export.parse_listen(listen)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    inventory = load_inventory()
    poller = export.Poller(inventory, select_targets(inventory, targets or []), timeout_s=timeout)
    try:
        export.serve(
            poller, listen=listen, textfile=str(textfile) if textfile else None, interval_s=interval
        )
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise UsageError(f"orch export: {exc}") from None


# --- first five minutes: demo, init, doctor --------------------------------------------------


@app.command("demo")
def demo_cmd(
    state_dir: Path | None = typer.Option(
        None,
        "--dir",
        help="State directory for the demo's sandbox (default: a new /tmp/orch-demo-*).",
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Leave the sandbox running afterwards and print how to explore it."
    ),
    fault: str = typer.Option(
        "both",
        "--fault",
        help="What to break: kill (SIGKILL the trainer), ghost (GPU 3, seed 000) or both.",
    ),
    watch_s: float = typer.Option(
        5.0, "--watch", min=0.0, help="Seconds of live view before the fault."
    ),
    yes: bool = typer.Option(False, "-y", "--yes", help="Ask nothing, even on a terminal."),
    as_json: bool = typer.Option(
        False, "--json", help="Also print the result as one JSON document at the end."
    ),
) -> None:
    """The whole loop on this machine in about a minute: sandbox, launch, watch, fault, postmortem.

    Starts a sandbox (a simulated Proxmox host: sshd, the pct stand-in, 8 fake GPUs),
    launches the bundled trainer (tiny CPU config) in ct200 through ssh and pct exec,
    shows the live view, injects the fault, shows the finding, prints the postmortem
    verdict and its HTML report, and stops the sandbox (--keep leaves it up). Asks
    before the fault and the teardown only when stdin is a terminal (and not --yes).
    Exit codes: 0 the loop ran and reached a verdict; 1 a step failed; 2 something
    needed is missing (each item is named with its install command).
    """
    from orchestrator import demo
    from orchestrator.views.demo import RichDemoUI

    interactive = sys.stdin.isatty() and not yes and not as_json
    ui = RichDemoUI(out_console, interactive=interactive)
    result = demo.run_demo(
        ui, state_dir=state_dir, keep=keep, fault=fault, watch_s=watch_s, interactive=interactive
    )
    if as_json:
        print_json(result.to_dict())


@app.command("init")
def init_cmd(
    host: str | None = typer.Option(
        None, "--host", help="Name of the Proxmox host (default pve1)."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Its IP or DNS name (default: the host name)."
    ),
    user: str | None = typer.Option(None, "--user", help="SSH user on the host (default root)."),
    port: int | None = typer.Option(None, "--port", help="SSH port (default 22)."),
    vmid: int | None = typer.Option(None, "--vmid", help="Container id (default 200)."),
    container: str | None = typer.Option(
        None, "--container", help="Container name in orch (default lxc<vmid>)."
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPUs: '0-7', 'target=0-4 drafter=5-7' or 'all' (default)."
    ),
    workdir: str | None = typer.Option(
        None, "--workdir", help="Working directory in the container (default /root/orch)."
    ),
    identity_file: str | None = typer.Option(
        None, "--identity-file", help="SSH private key (default ~/.ssh/id_* or ssh-agent)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="File to write (default: -c, $ORCH_CONFIG, else ~/.config/orch/hosts.yaml).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing file (the old one is kept as FILE.bak)."
    ),
    trust: bool | None = typer.Option(
        None,
        "--trust/--no-trust",
        help="Record the host's key now (orch trust HOST); asked when interactive.",
    ),
) -> None:
    """Write a starter hosts.yaml from flags, or by asking when stdin is a terminal.

    Missing flags are asked for when stdin is a terminal; otherwise their defaults are
    used and nothing is asked. The file is validated before and after writing (0600).
    Exit codes: 0 written; 2 a bad value; 4 the file exists (use --force; the old one is
    kept as FILE.bak); with --trust, the exit code of orch trust when it fails.
    """
    import os

    from orchestrator import init

    given = {"host": host, "address": address, "user": user, "port": port, "vmid": vmid,
             "container": container, "gpus": gpus, "workdir": workdir,
             "identity_file": identity_file}  # fmt: skip
    target = (
        out
        or state.config
        or (Path(os.environ["ORCH_CONFIG"]) if os.environ.get("ORCH_CONFIG") else None)
        or init.default_out()
    )
    interactive = init.stdin_is_terminal()
    init.refuse_existing(target, force=force)  # before asking anything
    if interactive:

        def prompt(text: str, default: str, convert: Any) -> Any:
            def proc(raw: str) -> Any:
                try:
                    return convert(raw)
                except ValueError as exc:
                    raise typer.BadParameter(str(exc)) from None  # the prompt asks again

            return typer.prompt(text, default=default, value_proc=proc)

        print(f"Writing {target}; press Enter to keep the [default].")
        answers = init.ask(given, prompt)
    else:
        answers = init.answers_from(given)
    written = init.write_config(answers, target, force=force)
    if written.backup:
        print(f"kept the old file as {written.backup}")
    print(
        f"wrote {written.path} (host {answers.host} at {answers.host_address}:{answers.port}, "
        f"container {answers.container_name} = vmid {answers.vmid})"
    )
    config_flag = [] if written.path == init.default_out() else ["-c", str(written.path)]
    shown = " ".join(["orch", *config_flag])
    if trust is None and interactive:
        trust = typer.confirm(
            f"Fetch and check {answers.host}'s SSH host key now (orch trust {answers.host})?",
            default=True,
        )
    if trust:
        code = run([*config_flag, "trust", answers.host])
        if code != 0:
            print(
                f"the file is written; once {answers.host} is reachable run: {shown} trust {answers.host}"
            )
            raise typer.Exit(code)
    else:
        print(f"next: {shown} trust {answers.host}   (record the host key)")
    print(f"then: {shown} doctor {answers.container_name}")


@app.command("doctor")
def doctor_cmd(
    target: str | None = typer.Argument(
        None, help="A container (or host) of hosts.yaml: also check the path to it."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print {"ok": bool, "checks": [{"name", "ok", "status", "detail", "fix"}]}.',
    ),
) -> None:
    """Check what orch needs, one line each (✓ ok, ! warning, ✗ failed, - skipped), with a fix.

    Without TARGET: the operator side (hosts.yaml, permissions, identity files, host keys,
    package versions). With TARGET: also ssh, pct on the host, the container running,
    python3 and tmux in it, NVML readable there (this deploys the agent, as any command does).
    Exit codes: 0 every check passed; 1 something failed; 2 TARGET is unknown.
    """
    from orchestrator import doctor

    on_check = None if as_json else (lambda c: print(doctor.render_text([c]), flush=True))
    checks = doctor.run_doctor(state.config, target, on_check=on_check)
    ok = doctor.passed(checks)
    if as_json:
        print_json(doctor.to_json(checks))
    else:
        failed = sum(c.status == doctor.FAIL for c in checks)
        print("all checks passed" if ok else f"{failed} check(s) failed")
    raise typer.Exit(0 if ok else 1)


def _click_exception_types() -> tuple[
    tuple[type[BaseException], ...],
    tuple[type[BaseException], ...],
    tuple[type[BaseException], ...],
]:
    """(exit, abort, usage-error) exception classes of typer's click and of click itself.

    typer >= 0.20 carries its own copy of click (``typer._click``) and no longer installs
    click, so ``click`` may be missing; where both exist, either may raise.
    """
    exits: set[type[BaseException]] = {typer.Exit}
    aborts: set[type[BaseException]] = {typer.Abort}
    usage: set[type[BaseException]] = set()
    try:
        from typer._click import exceptions as vendored
    except ImportError:
        pass
    else:
        usage.add(vendored.ClickException)
    try:
        import click
    except ImportError:
        pass
    else:
        exits.add(click.exceptions.Exit)
        aborts.add(click.exceptions.Abort)
        usage.add(click.ClickException)
    return tuple(exits), tuple(aborts), tuple(usage)


def run(argv: list[str] | None = None) -> int:
    """Run orch with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    Tests call this directly (with pytest's ``capsys``) to check codes and messages.
    """
    exit_types, abort_types, usage_types = _click_exception_types()
    try:
        rv = app(args=argv, prog_name="orch", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except OrchError as exc:
        # Text, not markup: the message may quote hosts.yaml content such as "[/x]" or ":smile:"
        from rich.text import Text

        line = Text.assemble(("error:", "bold red"), " ", str(exc))
        err_console.print(line, highlight=False, soft_wrap=True)
        return exc.exit_code
    except exit_types as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except abort_types:
        err_console.print("aborted")
        return 130
    except usage_types as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:  # noqa: BLE001 - last resort: a bug, show it
        import traceback

        traceback.print_exc()
        err_console.print(
            "[bold red]orch crashed: this is a bug.[/] Please report it with the traceback above."
        )
        return 70


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
