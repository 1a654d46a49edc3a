"""Profile: where the CPU of one ``orch check`` goes, on the operator and on a host.

One sandbox host (``orch.sandbox.manager.up``: real LXC containers where this machine can run
them, ``--isolation``) with ``--containers`` containers, a fake trainer in each. Then, each
``--repeat`` times:

- **host side**: the observer as ``orch check`` starts it over SSH (``host-observe
  --containers ... --state FILE``, in the environment the sandbox's sshd gives a session;
  the checkout's code instead of the deployed bundle), under a CPU sampler; once **cold**
  (no kept state: the first check of a host) and once **warm** (every later check: kept
  init PIDs, and the kernel cursor the previous check ended at); and once through the
  **resident** observer (``orchestrator/agent/resident.py``: the checkout's bundle deployed to
  a host ``agent_dir``, the host boot ``python3 -S -c HOST_BOOT`` as ``orch check`` runs it,
  warm): the boot's own CPU (``RUSAGE_CHILDREN``) plus the resident's for that request (a
  cgroup of its own, before and after, its serving fork gone; else ``/proc/PID/stat``);
- **operator side**: ``orch check --json`` over the host, in-process, under the same sampler.

The sampler (:class:`Sampler`) reads every thread's own CPU clock (``pthread_getcpuclockid``)
every millisecond and gives the CPU used since the previous sample to the first bucket
whose rule matches that thread's Python stack (rules in order, each a module path or a
function name anywhere on the stack): the buckets are disjoint and add up to the
process's CPU. Children (pct, journalctl, lxc-info) are counted by wrapping
``subprocess.run`` with ``RUSAGE_CHILDREN`` before and after (the observer runs them one at
a time). The interpreter's own start (before the first line of Python runs) is measured
apart: ``python3 -S -c pass`` for the host, ``python -c pass`` for the operator. The
operator's import time is also printed from ``python -X importtime``.

Prints a table per side (ms per check and per container, medians of ``--repeat``); ``--json``
prints one JSON object last. Needs root for LXC (else process mode, said so).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

Rule = tuple[str, Callable[[str, str], bool]]


def _in(*parts: str) -> Callable[[str, str], bool]:
    return lambda path, _fn: any(p in path for p in parts)


def _fn(*names: str) -> Callable[[str, str], bool]:
    return lambda _path, fn: fn in names


HOST_RULES: list[Rule] = [
    ("imports", _fn("_find_and_load")),
    ("children: pct", _fn("_child_pct")),
    ("children: journalctl/dmesg", _fn("_child_kernel")),
    ("children: lxc-info", _fn("_child_lxc")),
    ("children: other", _fn("_child_other")),
    ("NVML (host GPUs)", _in("agent/gpu.py", "agent/gpu_smi.py", "pynvml")),
    ("kernel log parse", _in("agent/kernel.py", "agent/netlog.py")),
    ("cgroup walks", _in("agent/cgroups.py")),
    ("/proc reads", _in("agent/hostprocs.py", "agent/procs.py")),
    (
        "files through the container root",
        _in("agent/rootfs.py", "agent/runfacts.py", "agent/rundir.py", "wire/progress"),
    ),
    ("container view (rest)", _in("agent/containerview.py")),
    ("JSON encode + write", _fn("_emit", "document_json", "to_dict")),
    ("observer (rest)", _in("agent/host.py", "agent/__main__.py")),
]
OPERATOR_RULES: list[Rule] = [
    ("imports", _fn("_find_and_load")),
    (
        "SSH handshake (kex, auth)",
        _fn(
            "_negotiate_keys",
            "_parse_kex_init",
            "_activate_outbound",
            "_activate_inbound",
            "parse_next",
            "auth_publickey",
            "_parse_kexecdh_reply",
            "_parse_kex_ecdh_reply",
            "_parse_kexc25519_reply",
            "_generate_key_pair",
            "connect",
            "start_client",
        ),
    ),
    ("SSH channel I/O (paramiko)", _in("paramiko")),
    (
        "JSON decode + documents",
        _fn("loads", "from_dict", "parse_host_document", "parse_answer", "parse_document"),
    ),
    ("detectors", _in("orchestrator/detect/")),
    ("SQLite (history)", _in("monitor/history.py", "sqlite3")),
    ("config (hosts.yaml)", _in("orchestrator/config/", "yaml/")),
    ("judge, alerts, state", _in("monitor/judge.py", "monitor/alerts.py", "monitor/state.py")),
    ("rendering", _in("orchestrator/views/", "rich/", "typer/", "click/")),
    ("other orchestrator code", _in("orchestrator/")),
]


def classify(frame: FrameType | None, rules: Sequence[Rule]) -> str:
    """The first rule (in order) that a frame of this stack matches, else ``other``."""
    stack: list[tuple[str, str]] = []
    while frame is not None:
        stack.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    for label, match in rules:
        if any(match(path, fn) for path, fn in stack):
            return label
    return "other"


class Sampler:
    """Every ``period_s``: each thread's CPU since the last sample, to its stack's bucket."""

    def __init__(self, rules: Sequence[Rule], period_s: float = 0.001) -> None:
        self.rules, self.period_s = rules, period_s
        self.ms: dict[str, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.ms

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        me = threading.get_ident()
        frames = sys._current_frames()
        for ident, frame in frames.items():
            if ident == me:
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, ProcessLookupError):
                continue
            used = cpu - self._last.get(ident, 0.0)
            self._last[ident] = cpu
            if used > 0:
                label = classify(frame, self.rules)
                self.ms[label] = self.ms.get(label, 0.0) + used * 1000


def wrap_children() -> None:
    """Make every ``subprocess.run`` a frame named after the tool, inside which its CPU (from
    ``RUSAGE_CHILDREN``) is charged to the sampler's thread: a child's CPU is not the
    thread's, so it is added to the bucket directly through :data:`CHILD_MS`."""
    real = subprocess.run

    def run(argv, *a, **kw):  # type: ignore[no-untyped-def]
        tool = os.path.basename(str(argv[0] if isinstance(argv, (list, tuple)) else argv))
        label = {
            "pct": "children: pct",
            "journalctl": "children: journalctl/dmesg",
            "dmesg": "children: journalctl/dmesg",
            "lxc-info": "children: lxc-info",
        }.get(tool, "children: other")
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            return real(argv, *a, **kw)
        finally:
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
            CHILD_MS[label] = CHILD_MS.get(label, 0.0) + used * 1000
            CHILD_CALLS[tool] = CHILD_CALLS.get(tool, 0) + 1

    subprocess.run = run  # type: ignore[assignment]


CHILD_MS: dict[str, float] = {}
CHILD_CALLS: dict[str, int] = {}


def inner_host(argv: list[str]) -> int:
    """``--inner-host ARGS``: run the host observer's command under the sampler; print its
    buckets (JSON) on stderr's last line, the document on stdout as the observer does."""
    wrap_children()
    sampler = Sampler(HOST_RULES)
    cpu0 = time.process_time()
    sampler.start()
    import io

    out = io.StringIO()
    real_stdout, sys.stdout = sys.stdout, out
    try:
        from orchestrator.agent.__main__ import main

        rc = main(argv)
    finally:
        sys.stdout = real_stdout
    ms = sampler.stop()
    for k, v in CHILD_MS.items():
        ms[k] = ms.get(k, 0.0) + v
    total = (time.process_time() - cpu0) * 1000 + sum(CHILD_MS.values())
    sys.stdout.write(out.getvalue())
    sys.stderr.write(
        "\nPROFILE "
        + json.dumps({"ms": ms, "total_ms": total, "calls": CHILD_CALLS, "rc": rc})
        + "\n"
    )
    return 0


def session_env(state_dir: Path) -> dict[str, str]:
    """The environment the sandbox's sshd gives a session (its ``SetEnv`` line)."""
    text = (state_dir / "sshd" / "sshd_config").read_text()
    env = {"HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    for line in text.splitlines():
        if line.startswith("SetEnv "):
            for word in re.findall(r'"([^"]*)"', line):
                k, _, v = word.partition("=")
                env[k] = v
    return env


def startup_ms(argv: list[str], n: int = 5) -> float:
    """Median CPU (ms) of a process that starts and exits at once."""
    got = []
    for _ in range(n):
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, check=True, capture_output=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        got.append((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) * 1000)
    return statistics.median(got)


def import_ms(argv: list[str]) -> tuple[float, list[tuple[str, float]]]:
    """``-X importtime``: the total and the heaviest top-level imports (ms, cumulative)."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, cwd=ROOT
    )
    top: list[tuple[str, float]] = []
    for line in res.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)", line)
        if m and not m.group(2):
            top.append((m.group(3), int(m.group(1)) / 1000))
    return sum(t for _, t in top), sorted(top, key=lambda x: -x[1])[:6]


def host_run(state_dir: Path, args: list[str], env: dict[str, str]) -> dict:
    # the boot's checks run on a real host; the profile runs the checkout under the sampler
    p = subprocess.run(
        [sys.executable, "-S", str(Path(__file__).resolve()), "--inner-host", *args],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=state_dir,
        timeout=300,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("PROFILE ")]
    if not lines:
        raise SystemExit(f"host observer failed: {p.stderr[-2000:]}")
    doc = json.loads(p.stdout)
    prof = json.loads(lines[-1][8:])
    prof["cursor"] = doc.get("kernel_cursor")
    prof["containers_seen"] = sum(
        1 for s in doc.get("containers", {}).values() if s.get("container_status") == "running"
    )
    return prof


def proc_cpu_ms(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` (its reaped children: the serving forks), ms."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


def _own_group(pid: int):  # type: ignore[no-untyped-def]
    """A CPU-accounting cgroup holding only ``pid`` (``bench/fleet.py``'s), or ``None``."""
    from fleet import CpuGroup  # type: ignore[import-not-found]

    group = CpuGroup(f"orch-profile-resident-{pid}")
    if group.path is None:
        return None
    try:
        (group.path / "cgroup.procs").write_text(str(pid))
    except OSError:
        group.remove()
        return None
    return group


def _children(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().strip()
    except OSError:
        return ""


class Resident:
    """The checkout's bundle in a host ``agent_dir`` under ``work``, its resident started as a
    host's first check starts it (that check's one-shot not measured)."""

    def __init__(self, work: Path, state_dir: Path, args: list[str], env: dict[str, str]) -> None:
        from orchestrator.agent.resident import socket_name
        from orchestrator.remote import deploy
        from orchestrator.transport.local import LocalTransport

        agent_dir = work / "agent"
        agent_dir.mkdir(mode=0o755)
        self.bundle = deploy.ensure_agent(
            LocalTransport(), str(agent_dir), sys.executable, host=True
        )
        self.state_dir, self.env = state_dir, env
        self.run(args)
        name = socket_name(env, str(state_dir), sys.executable)
        lock = Path(self.bundle) / (name[: -len(".sock")] + ".lock")
        deadline = time.monotonic() + 30
        while not (Path(self.bundle) / name).exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no resident observer started in {self.bundle}")
            time.sleep(0.05)
        self.pid = int(lock.read_text())
        self.group = _own_group(self.pid)

    def cpu_ms(self) -> float:
        """The resident's CPU so far (its serving forks included), ms: from a cgroup of its own
        (exact) where one can be made, else ``/proc/PID/stat`` (clock ticks: 10 ms steps)."""
        got = self.group.cpu_s() if self.group is not None else None
        return got * 1000 if got is not None else proc_cpu_ms(self.pid)

    def close(self) -> None:
        if self.group is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 9)
            deadline = time.monotonic() + 5
            while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            self.group.remove()

    def run(self, args: list[str]) -> tuple[dict, float]:
        """One check through the host boot: (its document, the boot process's CPU ms)."""
        from orchestrator.remote.boot import HOST_BOOT

        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(
            [sys.executable, "-S", "-c", HOST_BOOT, self.bundle, *args],
            capture_output=True,
            env=self.env,
            cwd=self.state_dir,
            timeout=300,
        )
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            raise SystemExit(f"host boot failed (exit {p.returncode}): {p.stderr[-2000:]!r}")
        return json.loads(p.stdout), (
            ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        ) * 1000

    def measure(self, args: list[str]) -> dict:
        """One check served by the resident: the client's CPU and the resident's for it."""
        before = self.cpu_ms()
        doc, client = self.run(args)
        deadline = time.monotonic() + 10
        while _children(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # the serving fork is reaped within 50 ms
        served = self.cpu_ms() - before
        if doc.get("served_by") != "resident":
            raise SystemExit(f"the resident did not answer: {doc.get('served_by')!r}")
        observe = float(doc["cost"]["cpu_ms"])
        return {
            "client_ms": client,
            "ms": {
                "resident: observe()": observe,
                "resident: fork, argv, reply": max(served - observe, 0.0),
            },
            "resident_ms": served,
            "cursor": doc.get("kernel_cursor"),
            "containers_seen": sum(
                1
                for c in doc.get("containers", {}).values()
                if c.get("container_status") == "running"
            ),
            "calls": {},
        }


def operator_run(config: Path, db: Path) -> dict:
    """``orch check --json`` in a child interpreter under the sampler (a fresh process each
    time, as cron runs it): its buckets."""
    code = (
        "import json, sys, time, resource\n"
        f"sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "import profile_check as pc\n"
        "s = pc.Sampler(pc.OPERATOR_RULES); c0 = time.process_time(); s.start()\n"
        "import io; out = io.StringIO(); real = sys.stdout; sys.stdout = out\n"
        "from orchestrator.cli import run\n"
        "try:\n"
        f"    sys.argv = ['orch', '-c', {str(config)!r}, 'check', '--json', '--db', {str(db)!r}]\n"
        "    run()\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stdout = real\n"
        "ms = s.stop()\n"
        "sys.stderr.write('\\nPROFILE ' + json.dumps({'ms': ms, 'total_ms': "
        "(time.process_time() - c0) * 1000, 'out': out.getvalue()[-20000:]}) + '\\n')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("PROFILE ")]
    if not lines:
        raise SystemExit(f"orch check failed: {p.stderr[-2000:]}")
    prof = json.loads(lines[-1][8:])
    doc = json.loads(prof.pop("out"))
    prof["reachable"] = sum(1 for t in doc["targets"] if t["reachable"])
    return prof


def medians(runs: list[dict], n: int, extra: dict[str, float]) -> tuple[list[dict], float]:
    labels = sorted({k for r in runs for k in r["ms"]} | set(extra))
    rows = []
    for label in labels:
        vals = [r["ms"].get(label, 0.0) + extra.get(label, 0.0) for r in runs]
        m = statistics.median(vals)
        rows.append({"bucket": label, "ms": round(m, 1), "ms_per_container": round(m / n, 2)})
    rows.sort(key=lambda r: -r["ms"])
    total = statistics.median([r["total_ms"] for r in runs]) + sum(extra.values())
    return rows, total


def print_table(title: str, rows: list[dict], total: float, n: int) -> None:
    print(f"{title}: {total:.1f} ms per check, {total / n:.2f} ms per container")
    print(f"  {'bucket':38s} {'ms/check':>9s} {'ms/ct':>7s} {'share':>6s}")
    for r in rows:
        share = 100 * r["ms"] / total if total else 0.0
        print(f"  {r['bucket']:38s} {r['ms']:9.1f} {r['ms_per_container']:7.2f} {share:5.0f}%")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--inner-host"]:
        return inner_host(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--isolation", choices=("auto", "lxc", "process"), default="auto")
    ap.add_argument(
        "--pct-cpu",
        type=float,
        default=0.3,
        help="CPU seconds each pct stand-in call spends (a real pct's Perl start-up)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="the tables as markdown (for docs)")
    args = ap.parse_args(argv)
    # The bytecode of every module, as an installed orch has it (pip compiles at install):
    # under PYTHONDONTWRITEBYTECODE=1 a checkout without __pycache__ would compile ~60
    # modules in every operator run (~300 ms counted as imports).
    import compileall

    compileall.compile_dir(ROOT / "orchestrator", quiet=1)
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.hostlink import HostLink
    from orchestrator.sandbox import manager

    sys.path.insert(0, str(ROOT / "bench"))
    from fleet import launch_trainers  # type: ignore[import-not-found]

    from orchestrator.wire.requests import GRACE_S

    work = Path(tempfile.mkdtemp(prefix="orch-profile-"))
    res: Resident | None = None
    state = work / "host"
    try:
        info = manager.up(
            state, containers=args.containers, gpus=8, scenario="idle", isolation=args.isolation
        )
        (state / "pct_cpu_s").write_text(f"{args.pct_cpu}\n")  # read by every pct call
        config = state / "hosts.yaml"
        inv = load_inventory(config)
        names = [n for n in inv.containers if n != "local"]
        launch_trainers(inv, grace_s=GRACE_S)
        env = session_env(state)
        link = HostLink(inv, inv.container(names[0]).host, names)
        kept = work / "containers.json"
        # the observer's own request, its init-PID state file kept where forget() can drop it
        hargs = dataclasses.replace(link._request(), state=str(kept)).to_argv()
        n = len(names)
        # warm-up: the operator deploys; the sandbox's files are in the page cache
        operator_run(config, work / "warm.db")
        cold, warm, oper, by_pct, resident = [], [], [], [], []
        res = Resident(work, state, hargs, env)

        def forget() -> None:
            kept.unlink(missing_ok=True)
            (work / "journal.json").unlink(missing_ok=True)

        for r in range(args.repeat):
            forget()  # LXC unknown: state and init PIDs from pct alone (the observer before)
            by_pct.append(host_run(state, hargs, {**env, "ORCH_LXC_PATH": "/nonexistent"}))
            forget()
            cold.append(host_run(state, hargs, env))
            # a later check passes the cursor the previous one ended at (sweep keeps it)
            cursor = ["--cursor", cold[-1]["cursor"]] if cold[-1]["cursor"] else []
            warm.append(host_run(state, [*hargs, *cursor], env))
            resident.append(res.measure([*hargs, *cursor]))
            oper.append(operator_run(config, work / f"op{r}.db"))
        py_host = startup_ms([sys.executable, "-S", "-c", "pass"])
        for one in resident:  # the boot's CPU past the interpreter's start: its client
            one["ms"]["boot client (connect, relay)"] = max(one["client_ms"] - py_host, 0.0)
            one["total_ms"] = sum(one["ms"].values())
        py_op = startup_ms([sys.executable, "-c", "pass"])
        imp_total, imp_top = import_ms(["-c", "import orchestrator.cli"])
        load = os.getloadavg()
    finally:
        try:
            if res is not None:
                res.close()
            manager.down(state)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out: dict = {
        "containers": n,
        "isolation": info.isolation,
        "pct_cpu_s": args.pct_cpu,
        "repeat": args.repeat,
        "loadavg": [round(x, 2) for x in load],
    }
    for tag, runs, start in (
        ("host_cold_pct", by_pct, py_host),
        ("host_cold", cold, py_host),
        ("host_warm", warm, py_host),
        ("host_resident", resident, py_host),
        ("operator", oper, py_op),
    ):
        rows, total = medians(runs, n, {"interpreter start": start})
        out[tag] = {
            "total_ms": round(total, 1),
            "ms_per_container": round(total / n, 2),
            "rows": rows,
        }
        if tag.startswith("host"):
            out[tag]["child_calls"] = runs[-1]["calls"]
            out[tag]["running_seen"] = statistics.median(r["containers_seen"] for r in runs)
        else:
            out[tag]["reachable"] = statistics.median(r["reachable"] for r in runs)
    out["operator_import_ms"] = round(imp_total, 1)
    out["operator_import_top"] = [[k, round(v, 1)] for k, v in imp_top]
    print(
        f"one check over {n} {info.isolation} containers on one host, pct stand-in "
        f"{args.pct_cpu:g} s CPU a call, medians of {args.repeat}, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for tag, title in (
        ("host_cold_pct", "host observer, cold, asking pct (LXC unknown)"),
        ("host_cold", "host observer, cold (first check: no kept init PIDs)"),
        ("host_warm", "host observer, warm (every later check)"),
        ("host_resident", "host observer, resident (warm, through the host boot)"),
        ("operator", "operator (orch check --json, one process)"),
    ):
        print()
        print_table(title, out[tag]["rows"], out[tag]["total_ms"], n)
        if "child_calls" in out[tag]:
            print(f"  child processes: {out[tag]['child_calls'] or 'none'}")
    print()
    print(
        f"operator imports (python -X importtime -c 'import orchestrator.cli'): "
        f"{imp_total:.0f} ms; heaviest: " + ", ".join(f"{k} {v:.0f}" for k, v in imp_top)
    )
    if args.markdown:
        print()
        print(markdown(out))
    if args.json:
        print(json.dumps(out))
    return 0


def markdown(out: dict) -> str:
    """The tables side by side, one row per bucket (ms per check / per container)."""
    tags = ("host_cold_pct", "host_cold", "host_warm", "host_resident", "operator")
    labels = []
    for tag in tags:
        labels += [r["bucket"] for r in out[tag]["rows"] if r["bucket"] not in labels]
    lines = [
        "| bucket | host, cold, by pct | host, cold | host, warm | host, resident | operator |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        cells = []
        for tag in tags:
            row = next((r for r in out[tag]["rows"] if r["bucket"] == label), None)
            cells.append(f"{row['ms']:.1f} ({row['ms_per_container']:.2f})" if row else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = [f"**{out[t]['total_ms']:.1f} ({out[t]['ms_per_container']:.2f})**" for t in tags]
    lines.append("| **all** | " + " | ".join(totals) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
