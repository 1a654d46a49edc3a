"""Detection commands: ``orch diagnose``, ``orch postmortem`` and ``orch playbook list|show|run``."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.commands._app import app, db_option, load_inventory, out_console, print_json

playbook_app = typer.Typer(help="List, show and run playbooks (failure signatures, procedures).")
app.add_typer(playbook_app, name="playbook")


@app.command()
def diagnose(
    logfile: Path = typer.Argument(
        ..., help="Any log file (ours or not); streamed, never loaded whole."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print {"matches": [...]} best first, each with confidence and confirm.',
    ),
    playbooks_dir: Path | None = typer.Option(
        None, "--playbooks", help="Playbook directory (default: bundled)."
    ),
) -> None:
    """Match a log against the signature playbooks, offline; best match first.

    Each match says how sure it is (certain: the signature names the failure; probable:
    the usual cause of a generic symptom, such as a bare "Killed") and the next check
    that would confirm it. Exit codes: 0 whether or not something matched (the answer is the output);
    2 for an unreadable log or a bad playbook file.
    """
    from orchestrator.errors import UsageError
    from orchestrator.playbooks.loader import (
        format_matches,
        iter_log_lines,
        load_playbooks,
        match_log,
    )
    from orchestrator.views.progress import format_progress
    from orchestrator.wire.progress import ProgressParser
    from orchestrator.wire.progress_summary import summary

    pbs = load_playbooks(playbooks_dir)
    progress = ProgressParser()
    try:
        matches = match_log(progress.tee(iter_log_lines(logfile)), pbs)
    except OSError as exc:
        raise UsageError(f"{logfile}: cannot read: {exc.strerror or exc}") from None
    read = summary(progress.framework, progress.result())
    if as_json:
        print_json(
            {"log": str(logfile), "matches": [m.to_dict() for m in matches], "progress": read}
        )
    else:
        print(format_matches(matches, pbs, str(logfile)))
        print(format_progress(read))


@app.command("postmortem")
def postmortem_cmd(
    target: str = typer.Argument(..., help="Container (or job) name from hosts.yaml."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: runs/current)."),
    out: Path | None = typer.Option(
        None, "--out", help="Bundle directory (default: <state>/postmortems/<target>-<run>-<ts>/)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"verdict": {...}, "findings": [...], "bundle": DIR}.'
    ),
    db: Path | None = db_option(),
) -> None:
    """Explain a run: evidence, detectors and playbooks, a verdict, and a bundle directory.

    Collects the manifest, exit status, log tail, last pane screen, flight recorder
    (gpu.jsonl), host kernel log since the launch and pct status; writes them with
    report.md and report.html to the bundle (0700 dir, 0600 files). Verdict kinds:
    container-stopped, oom-killer, stopped (orch stop asked), log-signature (with
    its playbook), crashed, silent-death, ghost-utilization, finished, other
    findings of a live run, or
    healthy. What orch supervise / check --heal decided about the run (restarted,
    gave up, and why) follows from the restart journal.

    A job: every node's evidence on one timeline (each host's clock offset measured
    and applied), the first failure (the earliest death, exception or kernel event;
    the other nodes' timeouts, closed connections, closed rendezvous and torchrun
    SIGTERMs are its consequences). --json: {"verdict": {"kind", "playbook",
    "summary", "first_failure": {"node", "rank", "at", "evidence"}}, "nodes": [...],
    "timeline": [...], "bundle"}.

    Exit codes: 0 a verdict was reached; 1 the run is alive and healthy
    (nothing to explain; the bundle is still written); 2 unknown target or run;
    3 host or container unreachable; 4 --out exists and is not empty.
    """
    from orchestrator.postmortem import collect as postmortem
    from orchestrator.views import postmortem as view
    from orchestrator.views.postmortem import print_verdict

    inventory = load_inventory()
    if target in inventory.jobs:
        from orchestrator.postmortem import jobs
        from orchestrator.views import job_report

        jpm = jobs.postmortem_job(
            inventory,
            inventory.job(target),
            run_id=run_id,
            out=out,
            report=lambda p: (job_report.markdown(p), job_report.html(p)),
            node_report=lambda p: (view.markdown(p), view.html(p)),
        )
        if as_json:
            print_json(jpm.to_dict())
        else:
            job_report.print_job_verdict(out_console, jpm)
        if not jpm.verdict.reached:
            raise typer.Exit(1)
        return
    pm = postmortem.postmortem(
        inventory,
        target,
        run_id=run_id,
        out=out,
        db_path=db,
        report=lambda p: (view.markdown(p), view.html(p)),
    )
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
    from orchestrator.playbooks.loader import load_playbooks

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
    from orchestrator.playbooks.loader import get_playbook, load_playbooks

    pb = get_playbook(load_playbooks(playbooks_dir), playbook_id)
    if as_json:
        print_json(pb.to_dict())
        return
    print(f"{pb.id}: {pb.title}  [{pb.kind}, {pb.severity}]")
    for sig in pb.signatures:
        what = "  ->  ".join(sig.patterns) if sig.is_stack else sig.patterns[0]
        span = f"  (stack, within {sig.within} lines)" if sig.is_stack else ""
        print(f"  match log [{sig.confidence}]: {what}{span}")
    for label, items in (("findings", pb.findings), ("exit codes", pb.exit_codes)):
        if items:
            print(f"  match {label}: " + "  |  ".join(str(i) for i in items))
    print("\n" + pb.diagnosis.strip())
    if pb.confirm:
        print("\nConfirm: " + " ".join(pb.confirm.split()))
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
    from orchestrator.lifecycle.procedures import (
        format_plan,
        plan_procedure,
        procedure_context,
        run_procedure,
    )
    from orchestrator.playbooks.loader import get_playbook, load_playbooks

    pb = get_playbook(load_playbooks(playbooks_dir), playbook_id)
    inventory = load_inventory()
    steps = plan_procedure(pb, procedure_context(inventory.container(target)))
    if not yes:
        if as_json:
            print_json(
                {
                    "playbook": pb.id,
                    "target": target,
                    "dry_run": True,
                    "steps": [s.to_dict() for s in steps],
                }
            )
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
