"""Launch preflight: check the container before anything starts (``PreflightRefused``, exit 4).

Container running, no live session unless ``--force``, assigned GPUs idle, disk free,
tmux present, torch and every ``requires`` module import, enough CUDA devices for the
bundled trainer's config. :func:`busy_gpus` and :func:`_cuda_problem` are pure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.config.limits import Limits
from orchestrator.detect.gpu import attributed
from orchestrator.errors import (
    ContainerNotRunning,
    OrchError,
    Refused,
    UsageError,
)
from orchestrator.lifecycle.bundle import DFLASH_CONFIG, DFLASH_CUDA_DEVICES
from orchestrator.remote.target import Host, Target, parse_document
from orchestrator.wire.model import GpuProcess, HostProbe, Snapshot

log = logging.getLogger(__name__)

IMPORT_CHECK_TIMEOUT_S = 180.0
"""Importing torch on a cold container can take a minute; a hung import is reported."""


_IMPORT_CHECK = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = None
    except BaseException as exc:
        out[name] = ('%s: %s' % (type(exc).__name__, exc))[:300]
cuda = None
if 'torch' in out and out['torch'] is None:
    try:
        cuda = sys.modules['torch'].cuda.device_count()
    except BaseException:
        pass
print(json.dumps({'modules': out, 'cuda_devices': cuda}))
"""


class PreflightRefused(Refused):
    """Preflight found reasons not to start; nothing was started (exit 4).

    >>> str(PreflightRefused("ct200", ["GPU 3 busy", "disk full"]))
    'ct200: launch refused, nothing was started:\\n  - GPU 3 busy\\n  - disk full'
    """

    def __init__(self, target: str, problems: Sequence[str]) -> None:
        self.target, self.problems = target, list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{target}: launch refused, nothing was started:\n{lines}")


def busy_gpus(
    snapshot: Snapshot,
    gpus: Sequence[int],
    busy_mem_mib: float,
    probes: Sequence[HostProbe] = (),
) -> list[str]:
    """One line per assigned GPU that holds memory above ``busy_mem_mib`` or a compute process.

    >>> from orchestrator.wire.model import GpuSample, GpuProcess
    >>> snap = Snapshot(target="ct", taken_at=0, gpus=(
    ...     GpuSample(index=0, memory_used_mib=0.0, processes=()),
    ...     GpuSample(index=3, memory_used_mib=117000.0, processes=(GpuProcess(pid=41, used_memory_mib=116900.0),))))
    >>> busy_gpus(snap, [0, 3], 1024.0)
    ['GPU 3 busy: 117000 MiB used, processes: pid 41 (116900 MiB)']
    >>> busy_gpus(snap, [5], 1024.0)
    ['GPU 5 is assigned but the container does not see it (GPUs seen: 0, 3)']

    Each process is named as :func:`~orchestrator.detect.gpu.attributed` reads it (the
    driver's PID numbering, the host ``probes``' mapping): ``pid 17 in CT 201``.
    """
    numbering = snapshot.nvml.pid_numbering if snapshot.nvml else None
    seen = {g.index: g for g in snapshot.gpus}
    out = []
    for index in gpus:
        g = seen.get(index)
        if g is None:
            have = ", ".join(str(i) for i in sorted(seen)) or "none"
            out.append(
                f"GPU {index} is assigned but the container does not see it (GPUs seen: {have})"
            )
            continue
        if g.error:
            out.append(f"GPU {index} reports an error: {g.error}")
            continue
        mem = g.memory_used_mib or 0.0
        procs = attributed(g, snapshot.vmid, probes, numbering) or ()
        if mem > busy_mem_mib or procs:
            shown = ", ".join(
                _pid_text(p)
                + (f" ({p.used_memory_mib:.0f} MiB)" if p.used_memory_mib else "")
                + (f" {p.name}" if p.name else "")
                for p in procs
            )
            out.append(
                f"GPU {index} busy: {mem:.0f} MiB used" + (f", processes: {shown}" if shown else "")
            )
    return out


def _sandbox_holders(target: Target, snap: Snapshot) -> dict[int, str]:
    """``{gpu index: the command that frees it}`` for each GPU whose every process is a fake
    PID of the live sandbox scenario (:func:`~orchestrator.sandbox.scenario.fake_pids`)."""
    from orchestrator.sandbox.scenario import fake_pids

    inv = target.inventory
    host = inv.hosts.get(target.container.host)
    fake = fake_pids([host.identity_file if host else None, inv.path])
    return {
        g.index: fake[g.processes[0].pid]
        for g in snap.gpus
        if g.processes and all(p.pid in fake for p in g.processes)
    }


def _pid_text(p: GpuProcess) -> str:
    """``pid 41`` (not known to be a container's), ``pid 17 in CT 201``."""
    if p.vmid is None:
        return f"pid {p.pid}"
    inner = p.container_pid if p.container_pid is not None else "?"
    return f"pid {inner} in {p.container or f'CT {p.vmid}'}"


def _host_probe(target: Target, snap: Snapshot, gpus: Sequence[int]) -> list[HostProbe]:
    """The host's probe when a busy assigned GPU has a process only the host can name (host
    PID numbering inside the container); ``[]`` when none has, or the probe failed."""
    c = target.container
    unnamed = any(
        p.vmid is None and p.container_pid is None
        for g in snap.gpus
        if g.index in gpus
        for p in g.processes or ()
    )
    if not unnamed or c.is_local or not c.host:
        return []
    try:
        return [Host(target.inventory, c.host).probe()]
    except OrchError as exc:
        log.info("%s: host probe for the GPU holders failed: %s", target.name, exc)
        return []


def holders(snapshot: Snapshot, gpus: Sequence[int], limits: Limits) -> list[str]:
    """What still holds a run that should be gone, one line each; empty when it is all free:
    its tmux pane alive, any process of its tree, a GPU holding memory or a compute process
    (:func:`busy_gpus`), or a ghost (utilization >= ``ghost_util_pct`` at <= ``ghost_mem_mib``).

    A relaunch waits for this to be empty: never start over a live run.

    >>> from orchestrator.wire.model import GpuSample, ProcessInfo, SessionState
    >>> from orchestrator.config.limits import Limits
    >>> free = Snapshot("ct", 0.0, gpus=(GpuSample(index=3, utilization_pct=0.0, memory_used_mib=0.0),))
    >>> holders(free, [3], Limits())
    []
    >>> ghost = Snapshot("ct", 0.0, session=SessionState("train", True, pane_dead=True),
    ...     processes=(ProcessInfo(pid=9, ppid=1, name="python3", state="S"),),
    ...     gpus=(GpuSample(index=3, utilization_pct=100.0, memory_used_mib=0.0, processes=()),))
    >>> holders(ghost, [3], Limits())
    ['process 9 (python3) of the run is alive', 'GPU 3 at 100 % with 0 MiB: a ghost reading']
    """
    out: list[str] = []
    sess = snapshot.session
    if sess is not None and sess.exists and sess.pane_dead is False:
        out.append(f"tmux session {sess.name!r} is live")
    out += [
        f"process {p.pid} ({p.name}) of the run is alive"
        for p in snapshot.processes
        if not p.zombie and p.state != "Z"
    ]
    out += busy_gpus(snapshot, gpus, limits.busy_mem_mib)
    seen = {g.index: g for g in snapshot.gpus}
    for index in gpus:
        g = seen.get(index)
        util, mem = (g.utilization_pct, g.memory_used_mib) if g is not None else (None, None)
        if (
            util is not None
            and util >= limits.ghost_util_pct
            and (mem or 0.0) <= limits.ghost_mem_mib
        ):
            out.append(f"GPU {index} at {util:.0f} % with {mem or 0:.0f} MiB: a ghost reading")
    return out


def container_status(target: Target) -> str:
    """``pct status`` for a container (``running`` for local); raises ContainerNotFound."""
    status = getattr(target.transport, "status", None)
    return "running" if target.container.is_local or status is None else str(status())


def _imports(target: Target, modules: Sequence[str]) -> tuple[dict[str, str | None], int | None]:
    """Import each module with the container's python: (name -> error text or ``None``,
    ``torch.cuda.device_count()`` when torch imported, else ``None``)."""
    c = target.container
    res = target.transport.run(
        [c.python, "-c", _IMPORT_CHECK, *modules], timeout=IMPORT_CHECK_TIMEOUT_S
    )
    if not res.stdout.strip():
        err = (res.err.strip().splitlines() or ["no output"])[-1][:300]
        return dict.fromkeys(modules, f"{c.python} failed (exit {res.exit_status}): {err}"), None
    doc = parse_document(target.name, res.stdout)
    found = doc.get("modules") or {}
    cuda = doc.get("cuda_devices")
    return {m: found.get(m) for m in modules}, cuda if isinstance(cuda, int) else None


def _cuda_problem(
    name: str, config: str, need: int, cuda_devices: int | None, gpus: Sequence[int]
) -> str | None:
    """Why ``config`` cannot run here (too few CUDA devices for the run), else ``None``.

    The run sees ``min(torch's count, assigned GPUs)`` devices (``CUDA_VISIBLE_DEVICES``).

    >>> _cuda_problem("ct200", "dflash-8gpu", 8, 0, range(8)).split(";")[0]
    "the bundled trainer's config 'dflash-8gpu' needs 8 CUDA devices, torch in ct200 sees 0"
    >>> _cuda_problem("ct200", "dflash-8gpu", 8, 8, range(8)) is None
    True
    """
    if not need or cuda_devices is None:
        return None
    visible = min(cuda_devices, len(gpus)) if gpus else cuda_devices
    if visible >= need:
        return None
    of = f" ({len(gpus)} GPUs assigned)" if gpus and len(gpus) < cuda_devices else ""
    return (
        f"the bundled trainer's config {config!r} needs {need} CUDA devices, torch in {name} "
        f"sees {cuda_devices}{of}; set trainer_config: tiny-cpu for {name} in hosts.yaml, "
        f"or launch with: orch launch {name} -- --config tiny-cpu"
    )


def _check_given_gpus(name: str, snap: Snapshot, gpus: Sequence[int]) -> None:
    """``UsageError`` when ``--gpus`` names a GPU the container does not see.

    >>> from orchestrator.wire.model import GpuSample
    >>> snap = Snapshot(target="ct", taken_at=0, gpus=tuple(GpuSample(index=i) for i in range(8)))
    >>> _check_given_gpus("ct200", snap, [8])
    Traceback (most recent call last):
    orchestrator.errors.UsageError: --gpus: ct200 has no GPU 8 (it sees GPUs 0-7); --gpus takes GPU indices, not a count: --gpus 0-7 uses all 8
    """
    seen = sorted(g.index for g in snap.gpus)
    unseen = [i for i in gpus if i not in seen]
    if not unseen or not seen:
        return
    have = (
        f"{seen[0]}-{seen[-1]}"
        if seen == list(range(seen[0], seen[-1] + 1))
        else (",".join(map(str, seen)))
    )
    raise UsageError(
        f"--gpus: {name} has no GPU {','.join(map(str, unseen))} (it sees GPUs {have}); "
        f"--gpus takes GPU indices, not a count: --gpus {have} uses all {len(seen)}"
    )


def preflight(
    target: Target,
    *,
    gpus: Sequence[int],
    bundled: bool,
    force: bool,
    config: str | None = None,
    gpus_given: bool = False,
    torch: bool | None = None,
) -> dict[str, Any]:
    """Check the container before anything starts; ``PreflightRefused`` lists every problem.

    ``gpus_given``: ``gpus`` came from ``--gpus``; one the container does not see is then a
    bad argument (``UsageError``, exit 2: ``--gpus 8`` means GPU 8, not eight GPUs).

    ``config``: the bundled trainer's config (:func:`trainer_config`); ``dflash-8gpu`` is
    refused where torch sees fewer CUDA devices than it uses. Returns the facts, the
    snapshot's session, the import results and torch's CUDA device count.

    ``torch``: check that torch imports (default: ``bundled``); ``False`` for a bundled run
    that is the torch-free stand-in (:func:`~orchestrator.lifecycle.bundle.stand_in_without_torch`).
    """
    c = target.container
    host = c.host
    state = container_status(target)
    if state != "running":
        raise ContainerNotRunning(host, c.vmid or 0)
    torch = bundled if torch is None else torch
    modules = (["torch"] if torch else []) + [m for m in c.requires if m != "torch" or not torch]
    with ThreadPoolExecutor(max_workers=3) as pool:
        f_snap = pool.submit(target.snapshot)
        f_facts = pool.submit(target.facts)
        f_imp = pool.submit(_imports, target, modules) if modules else None
        snap, facts = f_snap.result(), f_facts.result()
        imports, cuda_devices = f_imp.result() if f_imp else ({}, None)
    if gpus_given:
        _check_given_gpus(target.name, snap, gpus)
    problems: list[str] = []
    live = bool(snap.session and snap.session.exists and snap.session.pane_dead is False)
    if live and not force:
        run = snap.run.run_id if snap.run else "unknown run"
        problems.append(
            f"tmux session {c.session!r} is live ({run}); stop it (orch stop {target.name}) "
            f"or relaunch with --force (stops it gracefully, keeps its run directory)"
        )
    if not live or not force:
        # With --force the old run is stopped first and holds the GPUs until then.
        probes = _host_probe(target, snap, gpus)
        fake = _sandbox_holders(target, snap)
        problems += [
            f"{p}; "
            + (
                f"a fake process of the sandbox's scenario holds it: free it with "
                f"{fake[i]} (or pick others with --gpus)"
                if i in fake
                else f"free it (orch stop {target.name} if an orch run holds it, else end the "
                f"holder on {host}: pct exec {c.vmid} -- kill <pid above>) or pick "
                f"others with --gpus"
            )
            for i in gpus
            for p in busy_gpus(snap, [i], c.limits.busy_mem_mib, probes)
        ]
    free_mib = (facts.get("disk") or {}).get("free_mib")
    need_mib = c.limits.min_free_disk_gib * 1024
    if isinstance(free_mib, (int, float)) and free_mib < need_mib:
        problems.append(
            f"only {free_mib / 1024:.1f} GiB free in {c.workdir} (need {c.limits.min_free_disk_gib:g}); "
            f"free disk space (old checkpoints?) or lower thresholds.min_free_disk_gib"
        )
    if not (facts.get("tmux") or {}).get("version"):
        problems.append("tmux is not installed in the container; install it (apt install tmux)")
    for module, err in imports.items():
        if err:
            problems.append(
                f"module {module!r} does not import with {c.python} ({err}); "
                f"install it in the container ({c.python} -m pip install {module})"
            )
    if bundled and config is not None and config.removesuffix(".yaml") == DFLASH_CONFIG:
        why = _cuda_problem(target.name, DFLASH_CONFIG, DFLASH_CUDA_DEVICES, cuda_devices, gpus)
        if why:
            problems.append(why)
    if problems:
        raise PreflightRefused(target.name, problems)
    return {
        "facts": facts,
        "live": live,
        "imports": imports,
        "snapshot": snap,
        "cuda_devices": cuda_devices,
    }
