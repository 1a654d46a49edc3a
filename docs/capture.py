"""Regenerate docs/commands.md: every orch command run for real against a fresh sandbox.

Usage: ``python docs/capture.py [--out docs/commands.md]`` (about two minutes; needs what
``orch demo`` needs). Each command runs as a subprocess (``orch -c demo.yaml ...``,
100 columns, no colour); paths under the sandbox's state directory read ``$SANDBOX``,
and long outputs keep their first lines. Commands that would wait for a person
(``trust``, ``attach``, ``init`` questions) show their ``--help`` instead.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.firstrun import demo  # noqa: E402
from orchestrator.sandbox import manager  # noqa: E402

MAX_LINES = 40
ORCH = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One command to show: its section, argv after ``orch -c CFG``, and what it demonstrates."""

    section: str
    args: tuple[str, ...]
    note: str
    run_for_s: float | None = None  # long-running: SIGINT after this many seconds
    with_config: bool = True
    show_file: str | None = None  # a file the command wrote, shown after its output


ENTRIES = (
    Entry(
        "demo",
        ("demo", "--help"),
        "The whole loop in a minute; `orch demo` itself is run "
        "end to end by tests/firstrun/test_demo.py.",
        with_config=False,
    ),
    Entry(
        "sandbox",
        ("sandbox", "status", "--dir", "{state}"),
        "What runs in a sandbox.",
        with_config=False,
    ),
    Entry("hosts", ("hosts",), "The inventory, validated."),
    Entry("doctor", ("doctor", "ct200"), "The operator side and the path to a container."),
    Entry("facts", ("facts", "ct200"), "What the container offers (deploys the agent)."),
    Entry("launch", ("launch", "ct200", "--name", "docs"), "The bundled trainer (tiny-cpu)."),
    Entry("status", ("status",), "One row per target."),
    Entry("snapshot", ("snapshot", "ct200"), "One observation."),
    Entry("runs", ("runs", "ct200"), "The runs in the workdir."),
    Entry("logs", ("logs", "ct200", "-n", "8"), "The end of train.log, read from the end."),
    Entry(
        "watch",
        ("watch", "--plain", "--interval", "1"),
        "Plain lines (not a terminal); stopped with Ctrl-C after 6 s here.",
        run_for_s=6.0,
    ),
    Entry("check", ("check",), "For cron and Nagios: exit 0/1/2/3."),
    Entry(
        "supervise",
        ("supervise", "--help"),
        "Long-running: restarts dead runs its restart: policy and their playbooks allow "
        "(docs/self-healing.md; run end to end by tests/heal/test_heal_e2e.py).",
    ),
    Entry(
        "export",
        ("export", "--textfile", "{state}/orch.prom"),
        "Prometheus metrics, once, into a node_exporter textfile (shown below the command).",
        show_file="{state}/orch.prom",
    ),
    Entry("stop", ("stop", "ct200"), "SIGINT, then SIGTERM, then SIGKILL after the grace."),
    Entry(
        "postmortem", ("postmortem", "ct200", "--out", "{state}/pm"), "The stopped run explained."
    ),
    Entry("diagnose", ("diagnose", "{state}/pm/log-tail.txt"), "Offline log matching."),
    Entry("playbook", ("playbook", "list"), "The bundled playbooks."),
    Entry("trust", ("trust", "--help"), "Asks before it writes known_hosts."),
    Entry("attach", ("attach", "--help"), "Interactive: tmux attach through ssh and pct."),
    Entry("init", ("init", "--help"), "Writes a starter hosts.yaml."),
)


def sanitize(text: str, state: Path) -> str:
    """Replace the sandbox's paths and port-specific details with stable placeholders.

    >>> sanitize("/tmp/x/sb/a and /tmp/x/sb", Path("/tmp/x/sb"))
    '$SANDBOX/a and $SANDBOX'
    """
    text = text.replace(str(state), "$SANDBOX")
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def clip(text: str, limit: int = MAX_LINES) -> str:
    """At most ``limit`` lines, saying how many were left out.

    >>> clip("a\\nb\\nc", 2)
    'a\\nb\\n... (1 more line)'
    """
    lines = text.rstrip("\n").split("\n")
    if len(lines) <= limit:
        return "\n".join(lines)
    more = len(lines) - limit
    return "\n".join(lines[:limit] + [f"... ({more} more line{'s' if more > 1 else ''})"])


def run_one(entry: Entry, config: Path, state: Path, env: dict[str, str]) -> tuple[str, int]:
    args = [a.replace("{state}", str(state)) for a in entry.args]
    argv = ORCH + (["-c", str(config)] if entry.with_config else []) + args
    if entry.run_for_s is None:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        out = proc.stdout + proc.stderr
        if entry.show_file:
            path = Path(entry.show_file.replace("{state}", str(state)))
            if path.is_file():
                out += f"$ cat {path}\n" + path.read_text()
        return out, proc.returncode
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    ) as proc:
        time.sleep(entry.run_for_s)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        return out, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "commands.md")
    args = ap.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="orch-docs-", dir="/tmp")) / "sb"
    env = {
        **os.environ,
        "COLUMNS": "100",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "ORCH_STATE_DIR": str(state / "orch-state"),
    }
    manager.up(state, containers=1, gpus=8, scenario="idle")
    parts = [
        "# orch commands, with real output\n",
        "Generated by `python docs/capture.py` against a fresh sandbox "
        "(`orch sandbox up`, 8 simulated GPUs, scenario `idle`; `-c` names its `demo.yaml`, the "
        "sandbox's hosts.yaml with `trainer_config: tiny-cpu`). `$SANDBOX` is the sandbox's "
        "state directory. Do not edit by hand: rerun the script.\n",
    ]
    try:
        config = demo.write_demo_config(state)
        for e in ENTRIES:
            out, code = run_one(e, config, state, env)
            shown = " ".join(e.args).replace("{state}", "$SANDBOX")
            prefix = "orch -c $SANDBOX/demo.yaml " if e.with_config else "orch "
            parts.append(
                f"\n## {e.section}\n\n{e.note}\n\n```console\n$ {prefix}{shown}\n"
                f"{clip(sanitize(out, state))}\n```\nexit code {code}\n"
            )
            print(f"{e.section:<11} exit {code}", file=sys.stderr)
    finally:
        manager.down(state)
    args.out.write_text("".join(parts))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
