"""A sandbox's state directory: where things live in it, ``state.json``, the host's environment.

Layout (default ``~/.local/state/orch/sandbox``; several can coexist)::

    state.json                 what was started (isolation, sshd pid, port, containers, scenario)
    hosts.yaml                 inventory for it: host ``sandbox``, containers ct200, ct201, ...
    driver/scenario.json       the live GPU scenario ($ORCH_FAKE_NVML_SCENARIO; an LXC
                               container sees driver/ as /dev/orch-nvidia)
    kernel.log                 the kernel ring buffer (dmesg/journalctl stand-ins)
    lib/                       libnvidia-ml.so.1 (fakenvml.c), init (init.c)
    bin/                       pct, dmesg, journalctl, nvidia-smi, python3: first on the sshd's PATH
    sshd/                      sshd config, host key, client key, known_hosts, log
    etc/pve/lxc/<vmid>.conf    container configs, as on a Proxmox host
    containers/<vmid>/         a container's files (lxc.py or process.py says which)
    lxc/<vmid>/config          LXC mode: the lxcpath (``lxc-* -P DIR/lxc``), removed by ``down``
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError
from orchestrator.sandbox.files import write_atomic

DEFAULT_STATE_DIR = Path("~/.local/state/orch/sandbox")
HOST_NAME = "sandbox"
FIRST_VMID = 200
SESSION = "train"
WORKDIR = "root/dflash"
SCHEMA_VERSION = 1
ISOLATIONS = ("lxc", "process")


class SandboxError(OrchError):
    """The sandbox could not be started, changed or read (exit 1)."""


def resolve_state_dir(state_dir: Path | str | None) -> Path:
    """``state_dir`` (or the default) as an absolute path, ``~`` expanded."""
    return Path(state_dir or DEFAULT_STATE_DIR).expanduser().absolute()


def scenario_path(state_dir: Path) -> Path:
    """The live scenario file (its directory is what an LXC container sees as /dev/orch-nvidia)."""
    return state_dir / "driver" / "scenario.json"


def read_state(state_dir: Path) -> dict[str, Any]:
    """``state.json`` of a sandbox.

    Raises:
        SandboxError: there is none (the message says how to start one) or it is unreadable.
    """
    try:
        doc = json.loads((state_dir / "state.json").read_text())
    except FileNotFoundError:
        raise SandboxError(
            f"no sandbox in {state_dir} (no state.json); start one with: orch sandbox up --dir {state_dir}"
        ) from None
    except ValueError as exc:
        raise SandboxError(f"{state_dir / 'state.json'}: unreadable: {exc}") from exc
    if not isinstance(doc, dict):
        raise SandboxError(f"{state_dir / 'state.json'}: unreadable: not a JSON object")
    return doc


def write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """Replace ``state.json`` atomically."""
    write_atomic(state_dir / "state.json", json.dumps(state, indent=2) + "\n")


def isolation_of(state_dir: Path) -> str:
    """``lxc`` or ``process``: how the sandbox in ``state_dir`` runs its containers.

    ``process`` when state.json is missing or predates LXC mode.
    """
    try:
        value = json.loads((state_dir / "state.json").read_text()).get("isolation")
    except (OSError, ValueError, AttributeError):
        return "process"
    return value if value in ISOLATIONS else "process"


def host_env(state_dir: Path) -> dict[str, str]:
    """The variables the sandbox sshd sets for every command on the "host" (besides PATH).

    ``ORCH_SANDBOX_ISOLATION`` tells the pct stand-in which containers it drives before
    it reads anything (so a non-root caller gets pct's "please run as root" first).
    ``ORCH_LXC_PATH`` (LXC mode): the sandbox's lxcpath, where the host observer asks LXC
    (what ``lxc.lxcpath`` in ``/etc/lxc/lxc.conf`` would be; Proxmox keeps the default).
    ``ORCH_JOURNAL_FILES``: what the journalctl stand-in reads, whose size and mtime tell the
    host observer whether the journal moved (journald's own ``*.journal`` files on a host).
    """
    mode = isolation_of(state_dir)
    own = {"ORCH_LXC_PATH": str(state_dir / "lxc")} if mode == "lxc" else {}
    return {
        **own,
        "ORCH_JOURNAL_FILES": str(state_dir / "kernel.log"),
        "ORCH_SANDBOX_STATE": str(state_dir),
        "ORCH_SANDBOX_ISOLATION": mode,
        "ORCH_FAKE_NVML_SCENARIO": str(scenario_path(state_dir)),
        "LD_LIBRARY_PATH": str(state_dir / "lib"),
    }
