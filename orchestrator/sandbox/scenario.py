"""GPU scenarios: the bundled ones, loading, fitting to a GPU count, switching one live."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.sandbox import kernel
from orchestrator.sandbox.files import PACKAGE_DIR, write_atomic
from orchestrator.sandbox.state import (
    DEFAULT_STATE_DIR,
    read_state,
    resolve_state_dir,
    scenario_path,
    write_state,
)

SCENARIO_DIR = PACKAGE_DIR / "scenarios"


def scenario_names() -> list[str]:
    """The bundled scenario names (``healthy``, ``idle``, ``ghost``, ...)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def load_scenario(name_or_path: str | Path) -> tuple[str, dict[str, Any]]:
    """(name, document) of a bundled scenario name or a JSON file path.

    Raises:
        UsageError: neither a bundled name nor a readable JSON object (names the bundled ones).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if not path.is_file():
        path = SCENARIO_DIR / f"{text}.json"
    if not path.is_file():
        raise UsageError(
            f"unknown scenario {text!r}; bundled: {', '.join(scenario_names())}, or a JSON file path"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON scenario: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: a scenario is a JSON object")
    return path.stem, doc


def fake_pids(paths: Iterable[Path | str | None]) -> dict[int, str]:
    """``{pid: the command that frees it}`` for the GPU processes the live scenario lists
    (none of them exists: the fake driver reports them) of the sandbox whose state directory
    holds one of ``paths`` (its hosts.yaml, a host's client key: a copied hosts.yaml still
    names the key); empty when none is a sandbox's.

    >>> fake_pids([None, "/nonexistent/sshd/client_key"])
    {}
    """
    for raw in paths:
        if raw is None:
            continue
        here = Path(raw).expanduser().resolve()
        for state_dir in list(here.parents)[:4]:  # sshd/key, hosts/sandboxN/sshd/key
            if (state_dir / "state.json").is_file() and scenario_path(state_dir).is_file():
                return _scenario_pids(state_dir)
    return {}


def _scenario_pids(state_dir: Path) -> dict[int, str]:
    try:
        doc = json.loads(scenario_path(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    default = state_dir == DEFAULT_STATE_DIR.expanduser().resolve()
    line = "orch sandbox scenario idle" + ("" if default else f" --dir {state_dir}")
    devices = doc.get("devices") if isinstance(doc, dict) else None
    return {
        p["pid"]: line
        for d in devices or []
        if isinstance(d, dict)
        for p in d.get("processes") or []
        if isinstance(p, dict) and isinstance(p.get("pid"), int)
    }


def resize_scenario(doc: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """``doc`` with exactly ``gpus`` devices: extra ones cut, missing ones cloned from the last.

    >>> d = resize_scenario({"devices": [{"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0"}]}, 2)
    >>> [(x["index"], x["uuid"], x["pci_bus_id"]) for x in d["devices"]]
    [(0, 'GPU-a', '00000000:18:00.0'), (1, 'GPU-a-1', '00000000:E1:00.0')]
    """
    out = dict(doc)
    devices = [dict(d) for d in doc.get("devices") or []]
    if devices and gpus > 0:
        while len(devices) < gpus:
            i = len(devices)
            clone = dict(devices[-1])
            clone.update(
                index=i,
                uuid=f"{devices[0].get('uuid', 'GPU')}-{i}",
                pci_bus_id=f"00000000:{0xE0 + i:02X}:00.0",
            )
            devices.append(clone)
        out["devices"] = devices[:gpus]
    return out


def gpu_roles(gpus: int) -> dict[str, list[int]]:
    """Target/drafter split as in the seeds (8 GPUs: target 0-4, drafter 5-7).

    >>> gpu_roles(8)
    {'target': [0, 1, 2, 3, 4], 'drafter': [5, 6, 7]}
    >>> gpu_roles(1)
    {'target': [0]}
    """
    if gpus <= 1:
        return {"target": list(range(gpus))}
    drafter = max(1, (gpus * 3) // 8)
    return {"target": list(range(gpus - drafter)), "drafter": list(range(gpus - drafter, gpus))}


def pid_namespaces(doc: dict[str, Any], proc: str = "/proc") -> dict[str, Any]:
    """``doc`` with what the fake driver's ``pid_numbering: namespace`` needs (host side):
    ``host_pidns`` (this process's PID namespace) and, per GPU process still running, its
    ``pidns`` and ``ns_pid`` (``NSpid``'s last: its PID in its own namespace).

    A process that is gone gets neither, and the fake driver then leaves it out of every
    container's list, as the real one leaves out a PID its caller cannot see.
    """
    out = dict(doc)
    with contextlib.suppress(OSError):
        out["host_pidns"] = os.readlink(f"{proc}/self/ns/pid")
    devices = []
    for dev in out.get("devices") or []:
        dev = dict(dev)
        for key in ("processes", "graphics_processes", "mps_processes"):
            if isinstance(dev.get(key), list):
                dev[key] = [_with_ns(p, proc) for p in dev[key]]
        devices.append(dev)
    if devices:
        out["devices"] = devices
    return out


def _with_ns(entry: Any, proc: str) -> Any:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("pid"), int):
        return entry
    pid = entry["pid"]
    try:
        pidns = os.readlink(f"{proc}/{pid}/ns/pid")
        status = Path(f"{proc}/{pid}/status").read_text()
    except OSError:
        return entry
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return {**entry, "pidns": pidns, "ns_pid": int(line.split()[-1])}
    return entry


def set_scenario(state_dir: Path | str | None, scenario: str | Path | Mapping[str, Any]) -> str:
    """Switch the live scenario atomically (temp + rename) while things run; returns its name.

    ``scenario`` is a bundled name, a JSON file path, or a document (mapping). The
    devices are fitted to the sandbox's GPU count; the scenario's ``kernel_log``
    lines are appended to the kernel log, stamped now. GPU processes are given by
    host PID; with ``pid_numbering: namespace`` the fake driver answers each caller in its
    own PID namespace (:func:`pid_namespaces` records them), as drivers since 535.113.01 do.
    """
    state_dir = resolve_state_dir(state_dir)
    state = read_state(state_dir) if (state_dir / "state.json").exists() else {}
    if isinstance(scenario, Mapping):
        name, doc = str(scenario.get("name", "custom")), dict(scenario)
    else:
        name, doc = load_scenario(scenario)
    doc = resize_scenario(doc, int(state.get("gpus", len(doc.get("devices") or []))))
    doc["name"] = name
    doc = pid_namespaces(doc)
    path = scenario_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
    for line in doc.get("kernel_log") or []:
        kernel.append_kernel_line(state_dir, str(line), level=3)
    if state:
        state["scenario"] = name
        write_state(state_dir, state)
    return name


def read_scenario(state_dir: Path | str | None) -> dict[str, Any]:
    """The live scenario document of a sandbox."""
    doc: dict[str, Any] = json.loads(scenario_path(resolve_state_dir(state_dir)).read_text())
    return doc
