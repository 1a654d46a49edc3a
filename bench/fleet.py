"""Benchmark: ``orch check`` over 64 containers on 8 hosts behind 25 ms links, three ways.

Each of 8 sandbox hosts (``orch.sandbox.manager.up``, 8 containers x 8 GPUs; real LXC
containers where this machine can run them, ``--isolation``) lives in a network namespace
of its own (``ip netns`` + a veth pair): its containers are started from inside it (LXC's
command sockets are abstract unix sockets, which belong to a network namespace) and its
sshd listens there. ``bench/delay_proxy.py`` on 127.0.0.1 delays every byte by 25 ms in
each direction (this kernel has no ``netem``). One merged hosts.yaml names the 64
containers ``h<host>-ct<vmid>``; each runs a fake trainer (a line per second, in tmux).

Timed, interleaved, ``--repeat`` times after one untimed warm-up (agent deploys):

- ``concurrent_s``: ``orch check --json`` over all 64 by the host path (one observer call
  per host, the default);
- ``container_path_s``: the same check with ``observe: container`` (one ``pct exec`` agent
  snapshot per container plus one probe per host, concurrently): the path before the host
  observer;
- ``seeds_sequential_s``: the seeds' way, one container at a time: a new ``ssh HOST pct exec
  VMID -- bash -c "nvidia-smi ...; tmux capture-pane ...; tail -n 50 LOG"`` each.

``ratio`` = seeds_sequential_s / concurrent_s. ``cpu_ms_per_target``: all CPU on the hosts'
side (sshd sessions, observers, pct, journalctl: everything the 8 sshds start, counted in a
cpuacct cgroup) per container per check of the host path. That includes each host's resident
observer (``orchestrator/agent/resident.py``, started by the first check's boot with a double
fork and ``setsid``, which leave a process in its parent's cgroup; its serving forks too):
:meth:`Fleet.residents` lists them after the timed runs and the output says how many sit in
the group, with a warning for any that do not; the containers' own CPU (the
agents inside, on the container path) is counted in their cgroups and printed beside it.
On this machine the "remote" CPU shares the cores with the operator, so ``(operator +
remote CPU) / cores`` is a floor under the concurrent figures.

Needs root (namespaces) and cleans up everything it made. Goal: concurrent_s <= 2,
ratio >= 10, cpu_ms_per_target <= 30. ``--json`` prints one JSON object last:
``{"targets", "hosts", "concurrent_s", "seeds_sequential_s", "ratio", "cpu_ms_per_target",
"container_path_s", ...}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.sandbox import lxc, sshd  # noqa: E402 - after the path fix-up

SSHD = "/usr/sbin/sshd"
TRAINER = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500"; sleep 1; done'
SEED_SCRIPT = (
    "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader; echo ===; "
    "tmux capture-pane -t train -p -S -8 2>/dev/null; echo ===; "
    "tail -n 50 /root/dflash/runs/$(cat /root/dflash/runs/current)/train.log 2>/dev/null"
)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)


def free_subnet() -> int:
    """A third octet ``b`` such that 10.213.b.0/24 is not in use on this machine."""
    used = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    for b in range(16, 250, 8):
        if not any(f"10.213.{b + i}." in used for i in range(8)):
            return b
    raise SystemExit("no free 10.213.x.0/24 block for the benchmark's veths")


class CpuGroup:
    """A cgroup whose members' CPU time can be read (cgroup v1 cpuacct, or v2 with ``cpu``).

    With v2 alone, ``pct exec`` moves container processes to ``lxc/<vmid>``, out of
    this group: the remote figure then counts only the host side.
    """

    def __init__(self, name: str) -> None:
        self.path: Path | None = None
        self.v2 = False
        for root, v2 in ((Path("/sys/fs/cgroup/cpuacct"), False), (Path("/sys/fs/cgroup"), True)):
            probe = root / ("cgroup.controllers" if v2 else "cpuacct.usage")
            if not probe.exists() or (v2 and "cpu" not in probe.read_text().split()):
                continue
            try:
                (root / name).mkdir(exist_ok=True)
            except OSError:
                continue
            self.path, self.v2 = root / name, v2
            return

    def join(self) -> None:
        """Move the calling process in (a ``preexec_fn``: the child and all it starts)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self) -> float | None:
        return cgroup_cpu_s(self.path, self.v2) if self.path is not None else None

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError as exc:
                print(f"warning: cgroup {self.path} not removed: {exc}", file=sys.stderr)


def cgroup_cpu_s(path: Path, v2: bool) -> float | None:
    """CPU seconds used by everything in cgroup ``path`` (and below), ``None`` when unreadable."""
    try:
        if v2:
            for line in (path / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return None
        return int((path / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"sshd at {host}:{port} did not answer within {timeout_s} s")


def netns(ns: str) -> list[str]:
    """The prefix that runs a command in network namespace ``ns`` and nothing else: not ``ip
    netns exec``, whose fresh /sys has no cgroup file system (LXC and the observer need it)."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def in_netns(ns: str, code: str, *args: str, timeout_s: float = 600) -> str:
    """Run Python ``code`` (with this checkout importable) inside network namespace ``ns``."""
    res = subprocess.run(
        [*netns(ns), sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if res.returncode != 0:
        raise SystemExit(f"in {ns}: {res.stderr[-2000:]}")
    return res.stdout


UP = (
    "import json, sys; from orchestrator.sandbox import manager\n"
    "i = manager.up(sys.argv[1], containers=int(sys.argv[2]), gpus=8, scenario='idle',"
    " isolation=sys.argv[3])\n"
    "print(json.dumps({'port': i.port, 'isolation': i.isolation, 'fallback': i.fallback}))\n"
)
DOWN = "import sys; from orchestrator.sandbox import manager; manager.down(sys.argv[1])\n"


class Fleet:
    """Everything the benchmark starts, so that :meth:`close` can take it all down."""

    def __init__(
        self, hosts: int, per_host: int, delay_ms: float, workdir: Path, isolation: str
    ) -> None:
        self.hosts, self.per_host, self.delay_ms, self.workdir = hosts, per_host, delay_ms, workdir
        self.isolation = isolation
        self.pct_cpu_s = 0.0
        self.tag = f"ob{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        self.state_dirs: list[Path] = []
        self.sshds: list[subprocess.Popen[bytes]] = []
        self.proxy: subprocess.Popen[str] | None = None
        self.config = workdir / "hosts.yaml"
        self.inside_config = workdir / "hosts-inside.yaml"
        self.cpu = CpuGroup(f"orch-bench-{self.tag}")
        self.ports: list[int] = []
        self.hosts_doc: dict = {}

    def up(self) -> str:
        """Bring every host up; the isolation the containers got."""
        base = free_subnet()
        routes, merged = [], {"defaults": {"poll_interval": 2}, "hosts": {}, "containers": {}}
        got = self.isolation
        for h in range(self.hosts):
            state_dir = self.workdir / f"host{h}"
            self.state_dirs.append(state_dir)
            ns, veth_host, veth_ns = f"{self.tag}n{h}", f"{self.tag}h{h}", f"{self.tag}c{h}"
            host_ip, ns_ip = f"10.213.{base + h}.1", f"10.213.{base + h}.2"
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_ns)
            self.veths.append(veth_host)
            sh("ip", "link", "set", veth_ns, "netns", ns)
            sh("ip", "addr", "add", f"{host_ip}/24", "dev", veth_host)
            sh("ip", "link", "set", veth_host, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/24", "dev", veth_ns)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", veth_ns, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            # the containers start inside the namespace: lxc-attach reaches their monitors there
            info = json.loads(in_netns(ns, UP, str(state_dir), str(self.per_host), self.isolation))
            # every pct call costs what a real one does (orchestrator/sandbox/pct/cli.py)
            (state_dir / "pct_cpu_s").write_text(f"{self.pct_cpu_s}\n")
            got = info["isolation"]
            port = int(info["port"])
            self.ports.append(port)
            sshd.stop_sshd(state_dir / "sshd")
            config = state_dir / "sshd" / "sshd_config"
            config.write_text(
                config.read_text().replace(
                    f"ListenAddress 127.0.0.1:{port}", f"ListenAddress {ns_ip}:{port}"
                )
            )
            log = open(state_dir / "sshd" / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
            self.sshds.append(
                subprocess.Popen(
                    [*netns(ns), SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=self.cpu.join,
                )
            )
            wait_port(ns_ip, port)
            # the proxy takes the sandbox's old address, so its hosts.yaml and known_hosts hold
            routes.append(f"127.0.0.1:{port}={ns_ip}:{port}")
            doc = yaml.safe_load((state_dir / "hosts.yaml").read_text())
            merged["hosts"][f"h{h}"] = doc["hosts"]["sandbox"]
            for name, c in doc["containers"].items():
                merged["containers"][f"h{h}-{name}"] = {**c, "host": f"h{h}"}
        self.proxy = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "delay_proxy.py"),
                "--delay-ms",
                str(self.delay_ms),
                *routes,
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proxy.stdout is not None
        if self.proxy.stdout.readline().strip() != "ready":
            raise SystemExit("delay proxy did not start")
        self.hosts_doc = merged
        self.config.write_text(yaml.safe_dump(merged, sort_keys=False))
        inside = json.loads(json.dumps(merged))
        for host in inside["hosts"].values():
            host["observe"] = "container"
        self.inside_config.write_text(yaml.safe_dump(inside, sort_keys=False))
        return str(got)

    def start_runs(self) -> None:
        """A fake trainer in every container (through the agent's launch, concurrently)."""
        from orchestrator.config.inventory import load_inventory

        launch_trainers(load_inventory(self.config))

    def container_cpu_s(self) -> float | None:
        """CPU of everything inside the sandboxes' containers (their cgroup trees)."""
        total = 0.0
        for d in self.state_dirs:
            prefix = lxc.cgroup_prefix(d)
            for root, v2 in (
                (Path("/sys/fs/cgroup/cpuacct"), False),
                (Path("/sys/fs/cgroup"), True),
            ):
                got = cgroup_cpu_s(root / prefix, v2)
                if got is not None:
                    total += got
                    break
            else:
                return None
        return total

    def check(
        self, config: Path, jobs: int, db: Path, timeout_s: float
    ) -> tuple[float, dict, dict]:
        """One ``orch check --json`` as its own process; (wall s, its JSON, CPU s by side)."""
        argv = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "check",
            "--json",
            "--db",
            str(db),
            "--jobs",
            str(jobs),
            "--timeout",
            str(timeout_s),
        ]
        remote0, inside0 = self.cpu.cpu_s(), self.container_cpu_s()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s * 70
        )
        wall = time.perf_counter() - started
        ru1, remote1, inside1 = (
            resource.getrusage(resource.RUSAGE_CHILDREN),
            self.cpu.cpu_s(),
            self.container_cpu_s(),
        )
        cpu = {
            "operator": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "remote": None if remote0 is None or remote1 is None else remote1 - remote0,
            "inside": None if inside0 is None or inside1 is None else inside1 - inside0,
        }
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise SystemExit(
                f"orch check failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
            ) from None
        return wall, doc, cpu

    def residents(self) -> dict[str, int]:
        """The hosts' resident observers (their bundles under our state directories) and how
        many of them are in the bench's cgroup, where their CPU is counted with the hosts'."""
        roots = [str(d).encode() for d in self.state_dirs]
        found = counted = 0
        name = self.cpu.path.name if self.cpu.path is not None else None
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes()
                if b"orchestrator.agent.resident" not in cmd or not any(r in cmd for r in roots):
                    continue
                groups = (proc / "cgroup").read_text()
            except OSError:
                continue
            found += 1
            counted += name is not None and f"/{name}\n" in groups + "\n"
        return {"found": found, "in_cgroup": counted}

    def subset(self, hosts: int) -> tuple[Path, int]:
        """A hosts.yaml of the first ``hosts`` hosts and their containers; (path, targets)."""
        keep = list(self.hosts_doc["hosts"])[:hosts]
        doc = {
            **self.hosts_doc,
            "hosts": {h: self.hosts_doc["hosts"][h] for h in keep},
            "containers": {
                n: c for n, c in self.hosts_doc["containers"].items() if c["host"] in keep
            },
        }
        path = self.workdir / f"hosts-{hosts}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path, len(doc["containers"])

    def steady(self, argv: list[str], seconds: float, settle_s: float = 8.0) -> dict:
        """CPU of a long-running command (``orch export``, ``orch watch --plain``) over
        ``seconds`` after ``settle_s``: the operator's process and the hosts' side, each as
        % of one core."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "-c", str(self.config), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            time.sleep(settle_s)
            if proc.poll() is not None:
                raise SystemExit(f"{' '.join(argv)} exited {proc.returncode} while settling")
            op0, remote0, t0 = proc_cpu_s(proc.pid), self.cpu.cpu_s(), time.monotonic()
            time.sleep(seconds)
            op1, remote1, t1 = proc_cpu_s(proc.pid), self.cpu.cpu_s(), time.monotonic()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        span = t1 - t0
        hosts = None if remote0 is None or remote1 is None else (remote1 - remote0) / span * 100
        return {
            "operator_pct_core": round((op1 - op0) / span * 100, 1),
            "hosts_pct_core_per_host": None if hosts is None else round(hosts / self.hosts, 2),
        }

    def seeds(self) -> tuple[float, dict]:
        """The seeds' way over every container, one after the other; (wall s, CPU s by side)."""
        remote0, inside0 = self.cpu.cpu_s(), self.container_cpu_s()
        started = time.perf_counter()
        for h, (name, host) in enumerate(self.hosts_doc["hosts"].items()):
            for c in self.hosts_doc["containers"].values():
                if c["host"] != name:
                    continue
                argv = [
                    "ssh",
                    "-p",
                    str(self.ports[h]),
                    "-i",
                    host["identity_file"],
                    "-o",
                    f"UserKnownHostsFile={host['known_hosts']}",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-o",
                    "BatchMode=yes",
                    "-F",
                    "/dev/null",
                    f"{host['user']}@127.0.0.1",
                    "pct",
                    "exec",
                    str(c["vmid"]),
                    "--",
                    "bash",
                    "-c",
                    f"'{SEED_SCRIPT}'",
                ]
                out = subprocess.run(argv, capture_output=True, timeout=120, check=False)
                if out.stdout.count(b"===") < 2 or b"step=" not in out.stdout:
                    raise SystemExit(
                        f"seed poll of {name}/{c['vmid']} failed: {out.stderr[-300:]!r}"
                    )
        wall = time.perf_counter() - started
        remote1, inside1 = self.cpu.cpu_s(), self.container_cpu_s()
        return wall, {
            "remote": None if remote0 is None or remote1 is None else remote1 - remote0,
            "inside": None if inside0 is None or inside1 is None else inside1 - inside0,
        }

    def close(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(timeout=10)
        for state_dir, ns in zip(self.state_dirs, self.namespaces, strict=False):
            try:
                in_netns(ns, DOWN, str(state_dir))  # its sshd pid file is the namespaced sshd's
            except (SystemExit, Exception) as exc:  # noqa: BLE001 - keep cleaning up
                print(f"warning: sandbox down {state_dir}: {exc}", file=sys.stderr)
        for p in self.sshds:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for veth in self.veths:
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.cpu.remove()


def proc_cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of ``(targets, value)`` points (value per extra target).

    >>> slope([(8, 1.0), (64, 1.56)])
    0.01
    """
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return round(sum((x - mx) * (y - my) for x, y in points) / den, 5) if den else None


def med_ms(values: list[float], n: int) -> float | None:
    """Median of CPU seconds per check as ms per target."""
    return round(statistics.median(values) / n * 1000, 1) if values else None


def launch_trainers(inv: Any, grace_s: float = 2.0) -> None:
    """Start :data:`TRAINER` in every sandbox container of ``inv`` through the agent's typed
    launch, 4 at a time: each launch starts a tmux server, and a loaded 2-core machine lets
    tmux's 10 s deadline pass when 16 start at once (so each is tried up to 5 times)."""
    from orchestrator.errors import OrchError
    from orchestrator.remote.target import Target
    from orchestrator.transport.connect import close_all
    from orchestrator.wire.requests import LaunchRequest

    def launch(name: str) -> None:
        c = inv.container(name)
        req = LaunchRequest(c.workdir, TRAINER, session=c.session, force=True,
                            no_recorder=True, grace_s=grace_s)  # fmt: skip
        for attempt in range(5):
            try:
                Target(inv, name).launch(req, {}, timeout=120)
                return
            except OrchError as exc:
                print(f"{name}: launch {attempt + 1} failed: {exc}", file=sys.stderr)
        raise SystemExit(f"{name}: launch failed 5 times")

    names = [n for n in inv.containers if n != "local"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(launch, names))
    close_all()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument(
        "--per-host",
        "--containers-per-host",
        dest="per_host",
        type=int,
        default=8,
        help="containers per host",
    )
    ap.add_argument(
        "--pct-cpu",
        type=float,
        default=0.3,
        help="CPU seconds every pct stand-in call spends first (a real pct is a "
        "Perl start-up, ~0.3 s of CPU; 0: the bare stand-in)",
    )
    ap.add_argument("--delay-ms", type=float, default=25.0, help="added per direction")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each check (median)")
    ap.add_argument("--seed-repeat", type=int, default=3, help="timed runs of the seeds' way")
    ap.add_argument("--isolation", choices=("auto", "lxc", "process"), default="auto")
    ap.add_argument("--timeout", type=float, default=120.0, help="orch check --timeout (s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--keep", action="store_true", help="leave the state directory for inspection")
    ap.add_argument(
        "--slope",
        action="store_true",
        help="also time checks over 1 host and over all: wall and CPU against targets",
    )
    ap.add_argument(
        "--steady",
        type=float,
        default=0.0,
        metavar="S",
        help="also measure orch export and orch watch --plain at a 2 s interval "
        "for S seconds each (CPU %% of a core)",
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/fleet.py needs root for ip netns")
    workdir = Path(tempfile.mkdtemp(prefix="orch-bench-fleet-"))
    fleet = Fleet(args.hosts, args.per_host, args.delay_ms, workdir, args.isolation)
    fleet.pct_cpu_s = args.pct_cpu
    n = args.hosts * args.per_host
    figures: dict[str, list[float]] = {k: [] for k in ("host", "inside", "seeds")}
    cpu: dict[str, list[float]] = {}
    missed = 0
    med = statistics.median
    scale: list[dict] = []
    steady: dict[str, dict] = {}
    try:
        t0 = time.perf_counter()
        isolation = fleet.up()
        fleet.start_runs()
        print(
            f"fleet: {n} {isolation} containers on {args.hosts} hosts, +{args.delay_ms:g} ms "
            f"each way, a fake trainer in each (up in {time.perf_counter() - t0:.1f} s)",
            file=sys.stderr,
        )
        for config, tag in ((fleet.config, "host"), (fleet.inside_config, "inside")):
            for attempt in range(3):  # the first check deploys the agents everywhere
                wall, doc, _ = fleet.check(config, 64, workdir / f"warm-{tag}.db", args.timeout)
                down = [t for t in doc["targets"] if not t["reachable"]]
                print(
                    f"warm-up {tag} {attempt + 1}: {wall:.2f} s, status {doc['status']}, "
                    f"{len(down)} unreachable",
                    file=sys.stderr,
                )
                if len(doc["targets"]) == n and not down:
                    break
            else:
                raise SystemExit(f"warm-up ({tag}) did not reach every target")
        load_before = os.getloadavg()[0]
        for i in range(args.repeat):
            line = f"  run {i + 1}:"
            for config, tag in ((fleet.config, "host"), (fleet.inside_config, "inside")):
                wall, doc, used = fleet.check(config, 64, workdir / f"{tag}{i}.db", args.timeout)
                figures[tag].append(wall)
                for side, value in used.items():
                    if value is not None:
                        cpu.setdefault(f"{tag}_{side}", []).append(value)
                down = [t for t in doc["targets"] if not t["reachable"]]
                wrong = [
                    t
                    for t in doc["targets"]
                    if t["observed_from"] != ("host" if tag == "host" else "container")
                ]
                missed += len(down)
                assert not wrong, f"{tag}: {wrong[0]}"
                line += f" {tag} {wall:.2f} s" + (f" ({len(down)} unreachable)" if down else "")
            if i < args.seed_repeat:
                wall, used = fleet.seeds()
                figures["seeds"].append(wall)
                for side, value in used.items():
                    if value is not None:
                        cpu.setdefault(f"seeds_{side}", []).append(value)
                line += f" seeds {wall:.2f} s"
            print(line, file=sys.stderr)
        if args.slope:
            for hosts in sorted({1, args.hosts}):
                config, targets = fleet.subset(hosts)
                walls, ops, remotes = [], [], []
                for i in range(args.repeat):
                    wall, doc, used = fleet.check(
                        config, 64, workdir / f"s{hosts}-{i}.db", args.timeout
                    )
                    walls.append(wall)
                    ops.append(used["operator"])
                    if used["remote"] is not None:
                        remotes.append(used["remote"])
                scale.append(
                    {
                        "targets": targets,
                        "check_s": round(med(walls), 3),
                        "operator_cpu_s": round(med(ops), 3),
                        "remote_cpu_s": round(med(remotes), 3) if remotes else None,
                    }
                )
                print(f"  slope: {targets} targets: {scale[-1]}", file=sys.stderr)
        if args.steady > 0:
            for tag, argv in (
                ("export", ["export", "--listen", f"127.0.0.1:{free_port()}", "--interval", "2"]),
                ("watch", ["watch", "--plain", "--interval", "2"]),
            ):
                steady[tag] = fleet.steady(argv, args.steady)
                print(f"  steady {tag}: {steady[tag]}", file=sys.stderr)
        load_after = os.getloadavg()[0]
        residents = fleet.residents()
        if residents["found"] != residents["in_cgroup"]:
            print(
                f"warning: {residents['found'] - residents['in_cgroup']} resident observers "
                "outside the bench's cgroup: their CPU is not in the hosts' side",
                file=sys.stderr,
            )
    finally:
        fleet.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    c, inside, seeds = med(figures["host"]), med(figures["inside"]), med(figures["seeds"])
    per = {k: med_ms(v, n) for k, v in cpu.items()}
    cores = os.cpu_count() or 1
    floor = (
        round((per["host_operator"] + per["host_remote"]) * n / 1000 / cores, 2)
        if per.get("host_operator") and per.get("host_remote")
        else None
    )
    print(
        f"orch check over {n} {isolation} containers ({args.hosts} hosts, +{args.delay_ms:g} ms "
        f"each way), median of {args.repeat} (seeds: {args.seed_repeat}):"
    )
    print(f"  host path (concurrent):        {c:.2f} s")
    print(f"  container path (concurrent):   {inside:.2f} s")
    print(f"  seeds' way (sequential):       {seeds:.2f} s")
    print(f"  ratio seeds / host path:       {seeds / c:.1f}x   (goal: <= 2 s and >= 10x)")
    print(
        f"  CPU per target, host path:     hosts' side {per.get('host_remote')} ms (goal <= 30), "
        f"inside the containers {per.get('host_inside')} ms, operator {per.get('host_operator')} ms"
    )
    print(
        f"  CPU per target, container path: hosts' side {per.get('inside_remote')} ms, inside the "
        f"containers {per.get('inside_inside')} ms, operator {per.get('inside_operator')} ms"
    )
    print(
        f"  CPU per target, seeds' way:    hosts' side {per.get('seeds_remote')} ms, inside "
        f"{per.get('seeds_inside')} ms"
    )
    print(
        f"  all CPU of a host-path check on {cores} cores: >= {floor} s; load average "
        f"{load_before:.1f} -> {load_after:.1f}"
    )
    print(
        f"  resident observers: {residents['found']} found, {residents['in_cgroup']} in the "
        "bench's cgroup (counted in the hosts' side)"
    )
    if missed:
        print(f"  ({missed} target answers were missing over all timed runs; see stderr)")
    fits = {
        k: slope([(p["targets"], p[k]) for p in scale if p[k] is not None])
        for k in ("check_s", "operator_cpu_s", "remote_cpu_s")
    }
    for p in scale:
        print(
            f"  {p['targets']:4d} targets: check {p['check_s']:.2f} s, operator CPU "
            f"{p['operator_cpu_s']:.2f} s, hosts' CPU {p['remote_cpu_s']} s"
        )
    if scale:
        print(
            f"  slope per extra target: wall {fits['check_s']} s, operator CPU "
            f"{fits['operator_cpu_s']} s, hosts' CPU {fits['remote_cpu_s']} s"
        )
    for tag, got in steady.items():
        print(
            f"  steady orch {tag} at 2 s: operator {got['operator_pct_core']} % of a core, "
            f"hosts {got['hosts_pct_core_per_host']} % of a core per host"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "targets": n,
                    "hosts": args.hosts,
                    "isolation": isolation,
                    "concurrent_s": round(c, 3),
                    "seeds_sequential_s": round(seeds, 3),
                    "ratio": round(seeds / c, 2),
                    "cpu_ms_per_target": per.get("host_remote"),
                    "container_path_s": round(inside, 3),
                    "container_path_cpu_ms_per_target": per.get("inside_remote"),
                    "container_path_inside_cpu_ms_per_target": per.get("inside_inside"),
                    "host_path_inside_cpu_ms_per_target": per.get("host_inside"),
                    "operator_cpu_ms_per_target": per.get("host_operator"),
                    "seeds_cpu_ms_per_target": per.get("seeds_remote"),
                    "cpu_floor_s": floor,
                    "unreachable_seen": missed,
                    "cores": cores,
                    "pct_cpu_s": args.pct_cpu,
                    "scale": scale,
                    "slope_per_target": fits if scale else None,
                    "steady": steady or None,
                    "loadavg": [round(load_before, 2), round(load_after, 2)],
                    "residents": residents,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
