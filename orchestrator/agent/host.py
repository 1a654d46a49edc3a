"""The host observer: one process on the Proxmox host watches every container of it that
hosts.yaml names, and says so in one document per interval (:class:`~orchestrator.wire.model.HostDocument`).

Per document: the host's GPUs (NVML once for all containers), each GPU process mapped to its
container, its PID inside and its name (:func:`attribute_processes`); the kernel lines new
since the previous document (:mod:`orchestrator.agent.kernel`), each with the container it
belongs to (:func:`owner_of_event`); pct's word on every container; and per container the
run facts the in-container snapshot has, read from the host
(:class:`~orchestrator.agent.containerview.ContainerView`).

A container's state is asked only when it is not known (start-up, its init gone, a
stopped one every :data:`STOPPED_RECHECK_S`), first of LXC as pct itself does
(:mod:`orchestrator.agent.lxcstate`: the command sockets in ``/proc/net/unix``,
``lxc-info -p`` for the init PID); ``pct`` only for what LXC cannot tell (no
``<lxcpath>/<vmid>``: never started here, deleted, not LXC): ``pct list`` for several,
``pct status VMID --verbose`` for the init PID of a running one. A container that stops, is deleted or
restarts mid-stream is reported as such; nothing about one container stops the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.agent.cgroups import CgroupMounts, parse_cgroup_vmid, read_text
from orchestrator.agent.containerview import ContainerView
from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.hostprocs import ProcessReader, start_ticks
from orchestrator.agent.kernel import KernelParser, journal_signature, read_kernel
from orchestrator.agent.lxcstate import LxcState
from orchestrator.agent.netlog import vmid_of_device
from orchestrator.agent.procdetails import ProcDetails
from orchestrator.wire.formats import parse_pct_status
from orchestrator.wire.model import AgentCost, GpuSample, HostDocument, KernelEvent, Snapshot
from orchestrator.wire.requests import SESSION

STOPPED_RECHECK_S = 10.0
"""How often a stream asks pct again about a container it saw stopped or missing (seconds)."""
JOURNAL_STATE = "journal.json"
"""Beside the kept init PIDs: the cursor and journal signature of the last journalctl read.
A check passing that cursor while the journal's files have not moved runs no journalctl."""
KERNEL_EVERY_S = 5.0
"""Least seconds between two kernel-log reads of a stream (one ``journalctl`` process each)."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container to watch, as the operator passes it (``--containers`` JSON)."""

    name: str
    vmid: int
    workdir: str
    session: str = SESSION
    log_patterns: dict[str, str] | None = None
    run_id: str | None = None
    offset: int | None = None


def parse_specs(text: str) -> list[ContainerSpec]:
    """The ``--containers`` JSON list; ``ValueError`` naming what is wrong.

    >>> parse_specs('[{"name": "ct200", "vmid": 200, "workdir": "/root/w"}]')[0].vmid
    200
    >>> parse_specs('[{"name": "x"}]')
    Traceback (most recent call last):
    ...
    ValueError: --containers[0]: needs name, vmid and workdir
    """
    doc = json.loads(text)
    if not isinstance(doc, list):
        raise ValueError("--containers: expected a JSON list")
    out = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or not {"name", "vmid", "workdir"} <= set(item):
            raise ValueError(f"--containers[{i}]: needs name, vmid and workdir")
        known = {k: item[k] for k in ContainerSpec.__dataclass_fields__ if k in item}
        if not isinstance(known["vmid"], int) or not isinstance(known["workdir"], str):
            raise ValueError(f"--containers[{i}]: vmid must be an integer, workdir a string")
        out.append(ContainerSpec(**known))
    return out


def parse_pct_list(text: str) -> dict[int, str]:
    """``pct list`` output -> ``{vmid: status}`` (the header and unreadable lines skipped).

    The Lock column may be empty, so only the first two columns are read.

    >>> parse_pct_list("VMID       Status     Lock         Name\\n"
    ...                "200        running                 ct200\\n"
    ...                "201        stopped    backup       ct201\\n")
    {200: 'running', 201: 'stopped'}
    """
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out


def parse_pct_verbose(text: str) -> tuple[str, int | None]:
    """``pct status VMID --verbose`` -> (status, init PID or ``None``).

    >>> parse_pct_verbose("cpus: 2\\nname: ct200\\npid: 41234\\nstatus: running\\n")
    ('running', 41234)
    >>> parse_pct_verbose("status: stopped\\n")
    ('stopped', None)
    """
    pid = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "pid" and value.strip().isdigit():
            pid = int(value.strip())
    return parse_pct_status(text), pid


def pct_failure(text: str) -> str:
    """pct's word for a failed call, from its message (never its exit status): ``missing``
    for a container whose config does not exist, else ``unknown``.

    >>> pct_failure("Configuration file 'nodes/pve1/lxc/209.conf' does not exist")
    'missing'
    """
    low = text.lower()
    return "missing" if "does not exist" in low or "no such" in low else "unknown"


def normalize_pci(bus_id: str | None) -> str | None:
    """A PCI address as ``domain:bus:device`` in lower case (NVML's ``00000000:5D:00.0`` and
    the kernel's ``0000:5d:00`` or ``0000:5d:00.0`` alike).

    >>> normalize_pci("00000000:5D:00.0"), normalize_pci("0000:5d:00"), normalize_pci("5d:00.0")
    ('0000:5d:00', '0000:5d:00', '0000:5d:00')
    """
    if not bus_id:
        return None
    parts = bus_id.lower().split(".")[0].split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    try:
        return f"{int(parts[0], 16):04x}:{int(parts[1], 16):02x}:{int(parts[2], 16):02x}"
    except ValueError:
        return None


def gpu_of_pci(gpus: Sequence[GpuSample], pci: str | None) -> GpuSample | None:
    """The host GPU a kernel line's PCI address names."""
    want = normalize_pci(pci)
    if want is None:
        return None
    return next((g for g in gpus if normalize_pci(g.pci_bus_id) == want), None)


def owner_of_event(
    ev: KernelEvent,
    gpus: Sequence[GpuSample],
    pid_vmid: Mapping[int, int | None],
    claims: Mapping[int, Sequence[int]],
) -> KernelEvent:
    """``ev`` with its owner's ``vmid`` (and the GPU it names): the memory cgroup the kernel
    named (already set), the named process's container, the one container whose processes
    hold the named GPU, else the one container whose run claims that GPU (``claims``: vmid ->
    host GPU indices of its run). Several candidates or none: a host-wide event (``None``).

    >>> from orchestrator.wire.model import GpuProcess
    >>> g = GpuSample(index=3, pci_bus_id="00000000:5D:00.0",
    ...               processes=(GpuProcess(pid=9, vmid=201),))
    >>> e = KernelEvent(kind="xid", line="x", xid=79, pci="0000:5d:00")
    >>> owner_of_event(e, [g], {}, {}).vmid, owner_of_event(e, [g], {}, {}).gpu
    (201, 3)
    >>> owner_of_event(e, [GpuSample(index=3, pci_bus_id="0000:5d:00.0")], {}, {200: [3], 201: [3]}).vmid is None
    True
    """
    if ev.vmid is not None:
        return ev
    if ev.kind == "link-down":  # a guest's own port (veth, tap, fwbr/fwln/fwpr), or the host's
        vmid = vmid_of_device(ev.device or "")
        return replace(ev, vmid=vmid) if vmid is not None else ev
    gpu = gpu_of_pci(gpus, ev.pci) if ev.pci else None
    if gpu is not None:
        ev = replace(ev, gpu=gpu.host_index if gpu.host_index is not None else gpu.index)
    if ev.pid is not None and pid_vmid.get(ev.pid) is not None:
        return replace(ev, vmid=pid_vmid[ev.pid])
    if gpu is None or ev.kind == "oom-killer":
        return ev
    holders = {p.vmid for p in gpu.processes or () if p.vmid is not None}
    if len(holders) == 1:
        return replace(ev, vmid=holders.pop())
    if holders:
        return ev
    claimants = [vmid for vmid, idx in claims.items() if ev.gpu in idx]
    return replace(ev, vmid=claimants[0]) if len(claimants) == 1 else ev


def attribute_processes(
    gpus: Iterable[GpuSample], procs: ProcessReader, names: Mapping[int, str], proc: str = "/proc"
) -> tuple[GpuSample, ...]:
    """Each GPU process (a host PID, as NVML gives it) with its container's vmid and name, its
    PID inside (``NSpid``) and its ``comm``, read from the host's /proc.

    Equivalent: ``nvidia-smi --query-compute-apps=pid`` then, per PID, ``grep -m1 lxc
    /proc/PID/cgroup; grep NSpid /proc/PID/status; cat /proc/PID/comm``.
    """
    out = []
    for g in gpus:
        if not g.processes:
            out.append(g)
            continue
        mapped = []
        for p in g.processes:
            hp = procs.read(p.pid)
            vmid = parse_cgroup_vmid(read_text(f"{proc}/{p.pid}/cgroup") or "") if hp else None
            mapped.append(
                replace(
                    p,
                    name=hp.comm if hp is not None else p.name,
                    vmid=vmid,
                    container_pid=hp.inner if hp is not None and vmid is not None else None,
                    container=names.get(vmid) if vmid is not None else None,
                )
            )
        out.append(replace(g, processes=tuple(mapped)))
    return tuple(out)


def run_tool(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    import subprocess

    try:
        p = subprocess.run(
            list(argv),
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{argv[0]}: {exc}"
    text = (p.stdout if p.returncode == 0 else p.stderr or p.stdout).decode("utf-8", "replace")
    return p.returncode, text


class HostObserver:
    """Observes every container of ``specs`` from the host (state kept between documents).

    Args:
        specs: the containers (hosts.yaml's, with resume offsets).
        host: the name written into each document.
        since: kernel lines from this Unix time on (``None``: all of this boot, undated ones too).
        cursor: continue the kernel log after this journal cursor (wins over ``since``).
        timeout_s: limit per pct / journalctl call.
        gpu_deadline_s, gpu_source: as the in-container agent's.
        state_path: a file where the containers' init PIDs are kept between processes (one
            ``host-observe`` per ``orch check``): a container whose init is still the same
            process needs no ``pct`` at all (pct costs ~0.3 s of CPU a call on a real host).
    """

    def __init__(
        self,
        specs: Sequence[ContainerSpec],
        *,
        host: str = "",
        since: float | None = None,
        cursor: str | None = None,
        timeout_s: float = 10.0,
        gpu_deadline_s: float = 2.0,
        gpu_source: str | None = None,
        proc: str = "/proc",
        state_path: str | None = None,
    ) -> None:
        self.host = host or os.uname().nodename
        self.state_path = state_path
        self.proc = proc
        self.procs = ProcessReader(proc)
        self.details = ProcDetails(proc)
        self.mounts = CgroupMounts(proc)
        self.views: dict[int, ContainerView] = {}
        for s in specs:
            v = ContainerView(
                s.name,
                s.vmid,
                s.workdir,
                s.session,
                mounts=self.mounts,
                procs=self.procs,
                log_patterns=s.log_patterns,
                proc=proc,
            )
            v.runs.resume(s.run_id, s.offset)
            self.views[s.vmid] = v
        self.names = {s.vmid: s.name for s in specs}
        self.since, self.cursor = since, cursor
        self.timeout_s = timeout_s
        self.lxc = LxcState(proc=proc)
        self.gpus = GpuCollector(deadline_s=gpu_deadline_s, source=gpu_source)
        self.kernel = KernelParser(boot=0)
        self.kernel_every_s = 0.0  # one-shot: every document reads it; a stream sets it
        self._kernel_at: float | None = None
        self.source: str | None = None
        self.pid_vmid: dict[int, int | None] = {}
        self._kept = load_inits(state_path)
        self._journal_path = (
            os.path.join(os.path.dirname(state_path), JOURNAL_STATE) if state_path else None
        )
        self._journal = load_journal(self._journal_path)
        for vmid, (pid, start) in self._kept.items():
            kept = self.views.get(vmid)
            if kept is not None and start_ticks(pid, proc) == start and kept.attach(pid) is None:
                kept.status = "running"

    def close(self) -> None:
        self.gpus.close()
        for v in self.views.values():
            v.detach()

    # --- pct --------------------------------------------------------------------------------

    def _refresh_status(self, now: float, errors: list[str]) -> None:
        """pct's word (and the init PID) for every container whose state is not known now."""
        ask = []
        for v in self.views.values():
            if v.status == "running" and v.running():
                continue
            if v.status == "running":  # its init is gone: stopped, or restarting
                v.detach()
                v.status = None
            recheck = v.checked_at is None or now - v.checked_at >= STOPPED_RECHECK_S
            reappeared = v.cgroup is not None and os.path.isdir(v.cgroup)
            if v.status is None or recheck or reappeared:
                ask.append(v)
        ask = self._ask_lxc(ask, now)
        listed: dict[int, str] = {}
        if len(ask) > 1:  # one `pct list` for all (pct is ~0.3 s of CPU a call on a real host)
            rc, out = run_tool(["pct", "list"], self.timeout_s)
            listed = parse_pct_list(out) if rc == 0 else {}
        for v in ask:
            v.checked_at = now
            if listed and listed.get(v.vmid, "running") != "running":
                v.status = listed[v.vmid]
                continue
            rc, out = run_tool(["pct", "status", str(v.vmid), "--verbose"], self.timeout_s)
            if rc != 0:
                v.status = pct_failure(out) if listed.get(v.vmid) is None else "unknown"
                if v.status != "missing":
                    errors.append(f"pct status {v.vmid}: {out.strip()[:200] or f'exit {rc}'}")
                continue
            status, pid = parse_pct_verbose(out)
            v.status = status
            if status == "running" and pid is not None:
                why = v.attach(pid)
                if why:
                    v.status = "unknown"
                    errors.append(why)

    def _ask_lxc(self, ask: list[ContainerView], now: float) -> list[ContainerView]:
        """LXC's word (as pct itself learns it: :mod:`orchestrator.agent.lxcstate`) on the
        running ones of ``ask``: attached through their init PID. Left for pct (returned):
        those not running (stopped or deleted: only pct's config tells which), those LXC does
        not know, and any whose init PID it could not give (starting or stopping now)."""
        active = self.lxc.active(v.vmid for v in ask) if ask else {}
        if not active:
            return ask
        left = []
        for v in ask:
            if not active.get(v.vmid):
                left.append(v)
                continue
            pid, _why = self.lxc.init_pid(v.vmid, self.timeout_s)
            if pid is None or v.attach(pid) is not None:
                left.append(v)
                continue
            v.checked_at, v.status = now, "running"
        return left

    # --- one document -----------------------------------------------------------------------

    def observe(self) -> HostDocument:
        """One document. Never raises for what it finds: problems are ``errors``."""
        cpu0, wall0, kids0 = time.process_time(), time.monotonic(), _children_cpu_s()
        now = time.time()
        errors: list[str] = []
        self._refresh_status(now, errors)
        snaps: dict[str, Snapshot] = {}
        visible: dict[str, tuple[int, ...]] = {}
        for v in self.views.values():
            try:
                snaps[v.name] = v.observe(now)
            except Exception as exc:  # noqa: BLE001 - one container's trouble is its own
                # never "idle": a snapshot without its run would read as no run at all
                why = f"not observable from the host: {type(exc).__name__}: {exc}"[:300]
                snaps[v.name] = replace(
                    Snapshot.unreachable(v.name, now, why),
                    vmid=v.vmid,
                    source="host",
                    container_status=v.status,
                )
            for p in v.table.values():
                self.pid_vmid[p.pid] = v.vmid
        samples, nvml = self.gpus.collect()
        samples = attribute_processes(samples, self.procs, self.names, self.proc)
        samples = self.details.fill(samples)  # user, CPU % and command of each
        samples = tuple(replace(g, host_index=g.index) for g in samples)
        for v in self.views.values():
            if v.status == "running":
                devices = v.gpu_devices(now)
                visible[v.name] = tuple(
                    g.index for g in samples if devices is None or self._minor(g) in devices
                )
        events = self._events(samples, snaps, visible, errors)
        self._keep_inits()
        self.procs.forget((p.pid, p.start) for v in self.views.values() for p in v.table.values())
        if len(self.pid_vmid) > 50000:  # keep the killed-PID memory bounded
            self.pid_vmid = {p: self.pid_vmid[p] for p in list(self.pid_vmid)[-20000:]}
        return HostDocument(
            host=self.host,
            taken_at=now,
            gpus=samples,
            nvml=nvml,
            containers=snaps,
            visible_gpus=visible,
            container_status={vmid: v.status or "unknown" for vmid, v in self.views.items()},
            kernel_events=tuple(events),
            kernel_log_source=self.source,
            kernel_cursor=self.cursor,
            errors=tuple(errors),
            cost=AgentCost(
                cpu_ms=round((time.process_time() - cpu0 + _children_cpu_s() - kids0) * 1000, 3),
                bytes_read=0,
                wall_ms=round((time.monotonic() - wall0) * 1000, 3),
            ),
        )

    def _keep_inits(self) -> None:
        inits = {vmid: v.init for vmid, v in self.views.items() if v.init is not None}
        if self.state_path is None or inits == self._kept:
            return
        self._kept = dict(inits)  # type: ignore[arg-type]
        save_inits(self.state_path, self._kept)

    def _keep_journal(self, kept: tuple[str, str]) -> None:
        if kept == self._journal:
            return
        self._journal = kept
        if self._journal_path is not None:
            save_json(self._journal_path, list(kept))

    def _minor(self, g: GpuSample) -> int:
        return self.gpus.minor(g.index)

    def _events(
        self,
        gpus: Sequence[GpuSample],
        snaps: Mapping[str, Snapshot],
        visible: Mapping[str, Sequence[int]],
        errors: list[str],
    ) -> list[KernelEvent]:
        now = time.monotonic()
        if self._kernel_at is not None and now - self._kernel_at < self.kernel_every_s:
            return []
        self._kernel_at = now
        sig = journal_signature()  # before the read: what moves after it is read next time
        if sig is not None and self.cursor and self._journal == (self.cursor, sig):
            self.source = "journalctl"  # nothing after this cursor: no journalctl to run
            return []
        read = read_kernel(self.since, cursor=self.cursor, timeout_s=self.timeout_s)
        if read.source == "journalctl" and read.cursor and not read.errors and sig is not None:
            self._keep_journal((read.cursor, sig))
        errors.extend(read.errors)
        everything = self.since is None and self.cursor is None
        if read.source is not None:
            self.source = read.source
        events = [*self.kernel.feed(read.lines), *self.kernel.flush()]
        if not everything:
            events = [e for e in events if e.at is not None]  # an undated line is never new
        if read.cursor is not None:
            self.cursor = read.cursor
        newest = max((e.at for e in events if e.at is not None), default=None)
        if newest is not None and (self.since is None or newest > self.since):
            self.since = newest
        claims = run_claims(snaps, visible, self.names)
        return [owner_of_event(e, gpus, self.pid_vmid, claims) for e in events]


def run_claims(
    snaps: Mapping[str, Snapshot], visible: Mapping[str, Sequence[int]], names: Mapping[int, str]
) -> dict[int, list[int]]:
    """vmid -> host GPU indices its live run's manifest names (container indices mapped through
    what it sees).

    >>> from orchestrator.wire.model import RunManifest, RunState
    >>> m = RunManifest("r", "cmd", "/w", "train", 0.0, gpus=(0, 1))
    >>> s = Snapshot("ct200", 1.0, run=RunState("r", "/w/runs/r", manifest=m))
    >>> run_claims({"ct200": s}, {"ct200": (4, 5, 6)}, {200: "ct200"})
    {200: [4, 5]}
    """
    out: dict[int, list[int]] = {}
    for vmid, name in names.items():
        s = snaps.get(name)
        if s is None or s.run is None or s.run.manifest is None or s.run.exit_status is not None:
            continue
        seen = list(visible.get(name, ()))
        out[vmid] = [seen[i] for i in s.run.manifest.gpus if 0 <= i < len(seen)]
    return out


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (pct, journalctl): part of the cost."""
    t = os.times()
    return t.children_user + t.children_system


def load_inits(path: str | None) -> dict[int, tuple[int, int]]:
    """The kept ``{vmid: (init pid, start ticks)}`` (empty when missing or unreadable)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        return {int(k): (int(v[0]), int(v[1])) for k, v in doc.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return {}


def save_inits(path: str, inits: Mapping[int, tuple[int, int]]) -> None:
    """Write them atomically (0600: which processes are whose is the host's business)."""
    save_json(path, {str(k): list(v) for k, v in inits.items()})


def save_json(path: str, doc: object) -> None:
    """Write ``doc`` to ``path`` atomically, mode 0600 (a failure leaves the old file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def load_journal(path: str | None) -> tuple[str, str] | None:
    """The kept (journal cursor, journal signature) of the last read (``None``: none kept).

    >>> load_journal(None) is None
    True
    """
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            cursor, sig = json.load(fh)
        return (cursor, sig) if isinstance(cursor, str) and isinstance(sig, str) else None
    except (OSError, ValueError, TypeError):
        return None


def document_json(doc: HostDocument) -> dict[str, Any]:
    """The document as the command prints it (``schema_version`` first)."""
    data = doc.to_dict()
    return {"schema_version": data.pop("schema_version"), **data}
