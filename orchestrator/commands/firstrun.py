"""First-five-minutes commands: ``orch demo``, ``orch init`` and ``orch doctor``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from orchestrator.commands._app import (
    app,
    out_console,
    print_json,
    real_console,
    report_error,
    state,
)


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
    trainer_config: str = typer.Option(
        "tiny-cpu",
        "--trainer-config",
        help="Bundled trainer config for the run (instant-cpu: about a millisecond a step).",
    ),
    yes: bool = typer.Option(False, "-y", "--yes", help="Ask nothing, even on a terminal."),
    as_json: bool = typer.Option(
        False, "--json", help="Also print the result as one JSON document at the end."
    ),
) -> None:
    """The whole loop on this machine in about a minute: sandbox, launch, watch, fault, postmortem.

    Starts a sandbox (a simulated Proxmox host: sshd, the pct stand-in, 8 fake GPUs),
    launches the bundled trainer (tiny CPU config, training until the demo ends it) in ct200
    through ssh and pct exec, shows the live view until it trains, injects the fault, shows the finding, prints the postmortem
    verdict and its HTML report, and stops the sandbox (--keep leaves it up). Asks
    before the fault and the teardown only when stdin is a terminal (and not --yes).
    Exit codes: 0 the loop ran and reached a verdict; 1 a step failed; 2 something
    needed is missing (each item is named with its install command).
    """
    from orchestrator.commands.watching import watch_for
    from orchestrator.firstrun import demo
    from orchestrator.views.demo import RichDemoUI

    interactive = sys.stdin.isatty() and not yes and not as_json
    ui = RichDemoUI(real_console(out_console), interactive=interactive, watcher=watch_for)
    result = demo.run_demo(
        ui,
        state_dir=state_dir,
        keep=keep,
        fault=fault,
        watch_s=watch_s,
        interactive=interactive,
        trainer_config=trainer_config,
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

    from orchestrator.commands.foundation import trust_host
    from orchestrator.errors import OrchError
    from orchestrator.firstrun import init

    given = {
        "host": host,
        "address": address,
        "user": user,
        "port": port,
        "vmid": vmid,
        "container": container,
        "gpus": gpus,
        "workdir": workdir,
        "identity_file": identity_file,
    }
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
        try:
            code = trust_host(written.inventory, answers.host)
        except OrchError as exc:
            report_error(exc)
            code = exc.exit_code
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
    package versions). With TARGET: also ssh, pct and python3 on the host, the container
    running, python3 (>= 3.10) and tmux in it, NVML readable there (this deploys the agent,
    as any command does).
    Exit codes: 0 every check passed; 1 something failed; 2 TARGET is unknown.
    """
    from orchestrator.firstrun import checklist, doctor

    on_check = None if as_json else (lambda c: print(checklist.render_text([c]), flush=True))
    checks = doctor.run_doctor(state.config, target, on_check=on_check)
    ok = checklist.passed(checks)
    if as_json:
        print_json(checklist.to_json(checks))
    else:
        failed = sum(c.status == checklist.FAIL for c in checks)
        print("all checks passed" if ok else f"{failed} check(s) failed")
    raise typer.Exit(0 if ok else 1)
