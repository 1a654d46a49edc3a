"""A host whose journal is volatile: ``journalctl -k -b -1`` (the sandbox's stand-in in its
systemd 252 mode: stderr text, exit 0, no lines) is read as "the previous boot's kernel log
is not kept on this host", never as a clean previous boot."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandbox import kernel

BIN = Path(__file__).resolve().parents[2] / "orchestrator" / "sandbox" / "bin"


@dataclass
class _Result:
    ok: bool
    out: str
    err: str


class _Local:
    """Runs the host's commands here, against the sandbox's stand-ins (a host's PATH)."""

    def __init__(self, state: Path) -> None:
        self.env = {
            **os.environ,
            "ORCH_SANDBOX_STATE": str(state),
            "PATH": f"{BIN}:{os.environ['PATH']}",
        }

    def run(self, argv: list[str], timeout: float = 30.0) -> _Result:
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)
        return _Result(p.returncode == 0, p.stdout, p.stderr)


def test_the_stand_in_answers_as_systemd_252(tmp_path: Path) -> None:
    kernel.append_kernel_line(
        tmp_path, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    )
    kernel.reboot(tmp_path)
    host = _Local(tmp_path)
    assert host.run(["journalctl", "-k", "-b", "-1", "-q"]).out.strip()  # persistent: kept
    kernel.set_volatile_journal(tmp_path)
    res = host.run(["journalctl", "-k", "-b", "-1", "-q"])
    assert (res.ok, res.out) == (True, "")
    assert (
        res.err
        == "Specifying boot ID or boot offset has no effect, no persistent journal was found.\n"
    )
    assert len(host.run(["journalctl", "--list-boots"]).out.splitlines()) == 2  # header + boot 0


def test_the_postmortem_says_the_previous_boot_is_not_kept(tmp_path: Path) -> None:
    from orchestrator.agent.kernel import VOLATILE_NOTE
    from orchestrator.postmortem.collect import _kernel_log

    kernel.append_kernel_line(
        tmp_path, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    )
    kernel.reboot(tmp_path)
    kernel.set_volatile_journal(tmp_path)
    lines, tool, previous, volatile = _kernel_log(_Local(tmp_path), 0.0)
    assert (tool, previous, volatile) == ("journalctl", False, True)
    assert "previous boot's kernel log is not kept on this host" in VOLATILE_NOTE
    kernel.set_volatile_journal(tmp_path, on=False)
    lines, tool, previous, volatile = _kernel_log(_Local(tmp_path), 0.0)
    assert (previous, volatile) == (True, False) and any("Xid" in x for x in lines)


def test_the_report_carries_the_note() -> None:
    from types import SimpleNamespace

    from orchestrator.agent.kernel import VOLATILE_NOTE
    from orchestrator.views.postmortem import markdown

    v = SimpleNamespace(
        kind="silent-death",
        playbook=None,
        summary="s",
        died_at=None,
        cause="c",
        confidence="probable",
        confirm="",
        evidence=(),
        remedy=(),
    )
    ev = SimpleNamespace(
        target="ct200",
        run_id="R",
        exit_status=None,
        container_status="running",
        collected_at=None,
        tee_error=None,
        manifest=None,
        log_tail=(),
        pane=(),
        probe=None,
        errors=(),
        kernel_log_note=VOLATILE_NOTE,
    )
    text = markdown(SimpleNamespace(verdict=v, evidence=ev, findings=(), restarts=()))
    assert "Note: the previous boot's kernel log is not kept on this host" in text
