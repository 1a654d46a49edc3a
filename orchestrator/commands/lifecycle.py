"""Run lifecycle commands: ``orch launch``, ``stop``, ``logs``, ``status``, ``runs``, ``attach``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from orchestrator.commands._app import (
    app,
    db_option,
    err_console,
    load_inventory,
    out_console,
    print_json,
    real_console,
)
from orchestrator.wire.text import visible


def _remote(text: str) -> Any:
    """A line holding a container's text: controls shown, never rich markup."""
    from orchestrator.views.launch import remote_text

    return remote_text(text)


@app.command("launch")
def launch_cmd(
    target: str = typer.Argument(..., help="Container (or job) name from hosts.yaml."),
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

    A job (hosts.yaml jobs:) starts torchrun on every node under one run id, after
    every node passed preflight, and is verified when every node reached the
    rendezvous and made its first step; if one node fails, the others are stopped.

    Exit codes: 0 verified; 1 the run died during startup (exit status, last log
    lines and diagnosis are printed) or stayed silent; 2 bad arguments; 3
    unreachable; 4 refused by preflight (live session, busy GPUs, disk, missing
    modules, too few CUDA devices for the config): nothing started.
    """
    from orchestrator.lifecycle import launch
    from orchestrator.views.launch import PhaseProgress, launch_summary

    inventory = load_inventory()
    if target in inventory.jobs:
        _launch_job(
            inventory,
            target,
            cmd=cmd,
            gpus=gpus,
            env=env,
            name=name,
            force=force,
            grace=grace,
            no_verify=no_verify,
            as_json=as_json,
            trainer_args=trainer_args or [],
        )
        return
    progress = None if as_json else PhaseProgress(real_console(err_console))
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
                    "state": exc.state.to_dict(),
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


def _launch_job(
    inventory: Any,
    job_name: str,
    *,
    cmd: str | None,
    gpus: str | None,
    env: list[str],
    name: str | None,
    force: bool,
    grace: float,
    no_verify: bool,
    as_json: bool,
    trainer_args: list[str],
) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.lifecycle import job_launch
    from orchestrator.views.launch import PhaseProgress, job_summary

    if cmd or gpus:
        raise UsageError(
            f"{job_name} is a job: set its command and GPUs under jobs.{job_name} in hosts.yaml"
        )
    progress = None if as_json else PhaseProgress(real_console(err_console))
    try:
        result = job_launch.launch_job(
            inventory,
            inventory.job(job_name),
            env=env,
            run_name=name,
            force=force,
            verify=not no_verify,
            grace_s=grace,
            on_phase=progress,
            trainer_args=trainer_args,
        )
    except job_launch.JobLaunchFailed as exc:
        if as_json:
            node = exc.node
            print_json(
                {
                    "ok": False,
                    "error": "node-failed",
                    "message": str(exc),
                    "node": node.container if node else None,
                    "rank": node.rank if node else None,
                    "stopped": [s.to_dict() for s in exc.stopped],
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
        job_summary(out_console, result.to_dict())


@app.command("stop")
def stop_cmd(
    target: str = typer.Argument(..., help="Container (or job) name from hosts.yaml."),
    grace: float = typer.Option(
        60.0, "--grace", help="Seconds from SIGINT to SIGKILL (SIGTERM at half)."
    ),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the current run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Stop the run: SIGINT, then SIGTERM, then SIGKILL after --grace; idempotent.

    A job's run is stopped on every node at once, each recorded as requested.
    The tmux session and the run directory stay for the postmortem. Exit codes:
    0 stopped or already not running; 3 unreachable (a job: some node could not
    be reached; the others were stopped).
    """
    from orchestrator.lifecycle import stop

    inventory = load_inventory()
    if target in inventory.jobs:
        _stop_job(inventory, target, grace, run_id, as_json)
        return
    doc = stop.stop(inventory, target, grace_s=grace, run_id=run_id)
    if as_json:
        print_json(doc.to_dict())
    elif doc.stopped:
        out_console.print(
            _remote(
                f"stopped run {doc.run_id} with {', '.join(doc.signals) or 'no signal'} "
                f"in {doc.elapsed_s:.1f} s: exit status {doc.exit_status}"
            ),
            highlight=False,
        )
    elif doc.state == stop.NEVER_RAN:
        out_console.print(
            f"{target} has no run yet; nothing to stop (start one: orch launch {target})",
            highlight=False,
        )
    else:
        code = doc.exit_status
        state = f"exited {code}" if code is not None else doc.state
        out_console.print(
            _remote(f"run {doc.run_id} is not running ({state}); nothing to stop"), highlight=False
        )


def _stop_job(
    inventory: Any, job_name: str, grace: float, run_id: str | None, as_json: bool
) -> None:
    from orchestrator.lifecycle import jobs

    results = jobs.stop_job(inventory, inventory.job(job_name), grace_s=grace, run_id=run_id)
    if as_json:
        print_json({"job": job_name, "nodes": [r.to_dict() for r in results]})
    else:
        for r in results:
            a = r.answer
            if a is None:
                line = f"{r.node.label}: not stopped: {r.error}"
            elif a.stopped:
                line = (
                    f"{r.node.label}: stopped run {a.run_id} with "
                    f"{', '.join(a.signals) or 'no signal'} in {a.elapsed_s:.1f} s: exit status {a.exit_status}"
                )
            else:
                state = f"exited {a.exit_status}" if a.exit_status is not None else a.state
                line = f"{r.node.label}: run {a.run_id} is not running ({state}); nothing to stop"
            out_console.print(_remote(line), highlight=False)
    if any(r.error for r in results):
        raise typer.Exit(3)


@app.command("logs")
def logs_cmd(
    target: str = typer.Argument(..., help="Container (or job) name from hosts.yaml."),
    follow: bool = typer.Option(
        False,
        "-f",
        "--follow",
        help="Keep printing new lines (by byte offset) until the run ends or Ctrl-C.",
    ),
    lines: int = typer.Option(50, "-n", "--lines", help="Lines from the end to show first."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the current run)."),
    node: str | None = typer.Option(
        None, "--node", help="A job's node: its container name or rank (default: every node)."
    ),
) -> None:
    """Show the end of the run's log (train.log), read from the end; -f follows it.

    For a job, every node's log under a "==> ct200 (rank 0) <==" head, or one
    node's with --node (needed with -f). Exit codes: 0 done; 2 no such run; 3
    unreachable.
    """
    from orchestrator.errors import UsageError
    from orchestrator.lifecycle import runs

    inventory = load_inventory()
    if target in inventory.jobs:
        from orchestrator.lifecycle import jobs

        job = inventory.job(target)
        run_id = run_id or jobs.current_run(inventory, job)
        if node is None and follow:
            raise UsageError(
                f"orch logs -f {target} follows one node: add --node (one of {', '.join(job.containers)})"
            )
        if node is None:
            for n, doc in jobs.job_logs(inventory, job, lines=lines, run_id=run_id):
                sys.stdout.write(visible(f"==> {n.label} <==") + "\n")
                text = doc if isinstance(doc, str) else None
                for line in [f"(no log: {text})"] if text is not None else doc.lines:  # type: ignore[union-attr]
                    sys.stdout.write(visible(line) + "\n")
            return
        target = jobs.pick_node(job, node).container
    elif node is not None:
        raise UsageError(f"--node is for jobs; {target} is a container")
    if not follow:
        doc = runs.logs(inventory, target, lines=lines, run_id=run_id)
        for line in doc.lines:
            sys.stdout.write(visible(line) + "\n")
        return
    for chunk in runs.follow_logs(inventory, target, lines=lines, run_id=run_id):
        if chunk.truncated:
            err_console.print("[yellow]log truncated; reading from the start[/]")
        for line in chunk.lines:
            sys.stdout.write(visible(line) + "\n")
        sys.stdout.flush()
        if chunk.end:
            code = chunk.state.exit_status if chunk.state is not None else None
            err_console.print(f"[dim]run ended: exit status {code}[/]", highlight=False)


@app.command("status")
def status_cmd(
    targets: list[str] = typer.Argument(None, help="Container names (default: all in hosts.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per target."),
    db: Path | None = db_option(),
) -> None:
    """One table of every target, queried concurrently: reachable, container, session, run,
    age, step, tokens/s, GPU memory, and the restart journal's last decision (orch supervise,
    orch check --heal). A job is one row (its worst node's state, the total tokens/s) with its
    nodes beneath. Exit codes: 0 (problems are shown, not raised); 2 bad name.
    """
    import time

    from orchestrator.lifecycle import runs
    from orchestrator.lifecycle.jobs import job_names, status_rows
    from orchestrator.monitor.history import read_journal
    from orchestrator.monitor.journal import summary
    from orchestrator.views.launch import status_table

    inventory = load_inventory()
    names, jobs = job_names(inventory, targets or [])
    names = names or ["local"]
    rows = runs.status(inventory, names)
    journals = read_journal(names, db, inventory=inventory)
    now = time.time()
    for row in rows:
        policy = inventory.container(row["target"]).restart
        row["restarts"] = summary(
            journals[row["target"]],
            now=now,
            max_restarts=policy.max_restarts if policy else None,
            window_s=policy.window_s if policy else None,
        )
    rows = status_rows(inventory, jobs, rows)
    if as_json:
        print_json(rows)
    else:
        out_console.print(status_table(rows, out_console.width))


@app.command("runs")
def runs_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON."),
) -> None:
    """The runs in the container's workdir: running, exited N or vanished, and log sizes."""
    from orchestrator.lifecycle import runs
    from orchestrator.views.launch import runs_table

    doc = runs.runs(load_inventory(), target)
    if as_json:
        print_json(doc.to_dict())
    else:
        out_console.print(runs_table(doc))


@app.command("attach")
def attach_cmd(
    target: str = typer.Argument(..., help="Container name from hosts.yaml."),
    print_only: bool = typer.Option(False, "--print", help="Only print the command."),
) -> int:
    """Attach to the run's tmux session (ssh -t, pct exec, tmux attach); detach with C-b d."""
    import subprocess

    from orchestrator.lifecycle import runs
    from orchestrator.wire.quoting import command_line

    argv = runs.attach_argv(load_inventory(), target)
    if print_only:
        print(command_line(argv))
        return 0
    return subprocess.call(argv)
