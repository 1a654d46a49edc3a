"""Benchmark: ``orch check --json`` over 64 containers on 8 hosts behind 25 ms links.

Each of 8 sandbox hosts (``orch.sandbox.manager.up``, 8 containers x 8 GPUs) has
its sshd moved into a network namespace of its own (``ip netns`` + a veth pair),
and is reached through ``bench/delay_proxy.py`` on 127.0.0.1, which delays every
byte by 25 ms in each direction (this kernel has no ``netem``). One merged
hosts.yaml names the 64 containers ``h<host>-ct<vmid>``.

The same ``orch check --json`` runs concurrently (``--jobs 64``, the default
pool) and strictly sequentially (``--jobs 1``), interleaved, ``--repeat`` times
each after one untimed warm-up (agent deploy); the medians and their ratio are
printed, and with ``--json`` the last line is
``{"targets": 64, "concurrent_s": ..., "sequential_s": ..., "ratio": ...}``.

Where the time goes: the CPU of the ``orch check`` process (operator) and of
everything the 8 sshds start (the simulated hosts and containers: sessions, pct,
agents, probes; counted in a cpuacct cgroup when this kernel has one) are
printed per target, with the load average. On this machine the "remote" CPU
runs on the same cores as the operator, so ``(operator + remote CPU) / cores``
(``cpu_floor_s``) is a floor under the concurrent figure.

Needs root (namespaces) and cleans up everything it made: namespaces, veths,
sshds, tmux servers, the cgroup and the state directory. Goal: <= 2 s and >= 10x.
"""

from __future__ import annotations

import argparse
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.sandbox import manager, sshd  # noqa: E402 - after the path fix-up

SSHD = "/usr/sbin/sshd"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


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
        if self.path is None:
            return None
        if self.v2:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError as exc:
                print(f"warning: cgroup {self.path} not removed: {exc}", file=sys.stderr)


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


class Fleet:
    """Everything the benchmark starts, so that :meth:`close` can take it all down."""

    def __init__(self, hosts: int, per_host: int, delay_ms: float, workdir: Path) -> None:
        self.hosts, self.per_host, self.delay_ms, self.workdir = hosts, per_host, delay_ms, workdir
        self.tag = f"ob{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        self.state_dirs: list[Path] = []
        self.sshds: list[subprocess.Popen[bytes]] = []
        self.proxy: subprocess.Popen[str] | None = None
        self.config = workdir / "hosts.yaml"
        self.cpu = CpuGroup(f"orch-bench-{self.tag}")

    def up(self) -> None:
        base = free_subnet()
        routes, merged = [], {"defaults": {"poll_interval": 2}, "hosts": {}, "containers": {}}
        for h in range(self.hosts):
            state_dir = self.workdir / f"host{h}"
            self.state_dirs.append(state_dir)
            # its bin/ and each container's usr/bin/ hold python3 -> the real interpreter
            info = manager.up(  # process mode: 64 containers; this bench measures orch, not LXC
                state_dir, containers=self.per_host, gpus=8, scenario="healthy", isolation="process"
            )
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
            # move the sandbox's sshd into the namespace: same config, keys and port
            sshd.stop_sshd(state_dir / "sshd")
            config = state_dir / "sshd" / "sshd_config"
            config.write_text(
                config.read_text().replace(
                    f"ListenAddress 127.0.0.1:{info.port}", f"ListenAddress {ns_ip}:{info.port}"
                )
            )
            log = open(state_dir / "sshd" / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
            self.sshds.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=self.cpu.join,
                )
            )
            wait_port(ns_ip, info.port)
            # the proxy takes the sandbox's old address, so its hosts.yaml and known_hosts hold
            routes.append(f"127.0.0.1:{info.port}={ns_ip}:{info.port}")
            doc = yaml.safe_load(info.config_path.read_text())
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
        self.config.write_text(yaml.safe_dump(merged, sort_keys=False))

    def check(self, jobs: int, db: Path, timeout_s: float) -> tuple[float, dict, dict]:
        """One ``orch check --json`` as its own process; (wall s, its JSON, CPU s by side)."""
        argv = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(self.config),
            "check",
            "--json",
            "--db",
            str(db),
            "--jobs",
            str(jobs),
            "--timeout",
            str(timeout_s),
        ]
        remote0, ru0 = self.cpu.cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s * 70
        )
        wall = time.perf_counter() - started
        ru1, remote1 = resource.getrusage(resource.RUSAGE_CHILDREN), self.cpu.cpu_s()
        cpu = {
            "operator": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "remote": None if remote0 is None or remote1 is None else remote1 - remote0,
        }
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise SystemExit(
                f"orch check failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
            ) from None
        return wall, doc, cpu

    def close(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(timeout=10)
        for state_dir in self.state_dirs:
            try:
                manager.down(state_dir)  # its sshd pid file is the namespaced sshd's
            except Exception as exc:  # noqa: BLE001 - keep cleaning up
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--per-host", type=int, default=8, help="containers per host")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="added per direction")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each mode (median)")
    ap.add_argument("--timeout", type=float, default=120.0, help="orch check --timeout (s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--keep", action="store_true", help="leave the state directory for inspection")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/fleet.py needs root for ip netns")
    workdir = Path(tempfile.mkdtemp(prefix="orch-bench-fleet-"))
    fleet = Fleet(args.hosts, args.per_host, args.delay_ms, workdir)
    n = args.hosts * args.per_host
    try:
        t0 = time.perf_counter()
        fleet.up()
        print(
            f"fleet: {n} containers on {args.hosts} hosts, +{args.delay_ms:g} ms each way "
            f"(up in {time.perf_counter() - t0:.1f} s)",
            file=sys.stderr,
        )
        for attempt in range(3):  # the first check deploys the agent everywhere
            warm, doc, _cpu = fleet.check(64, workdir / "warm.db", args.timeout)
            states = sorted({t["state"] for t in doc["targets"]})
            print(
                f"warm-up {attempt + 1}: {warm:.2f} s, status {doc['status']}, states {states}",
                file=sys.stderr,
            )
            down = [t for t in doc["targets"] if not t["reachable"]]
            for t in down[:3]:
                print(
                    f"  {t['name']}: {t['findings'][0]['evidence'] if t['findings'] else '?'}",
                    file=sys.stderr,
                )
            if len(doc["targets"]) == n and not down:
                break
        else:
            raise SystemExit(f"warm-up did not reach every target: {doc['status']}")
        conc, seq, missed = [], [], 0
        cpu_seen: dict[str, list[float]] = {"operator": [], "remote": []}
        load_before = os.getloadavg()[0]
        for i in range(args.repeat):
            line = f"  run {i + 1}:"
            for jobs, walls, tag in ((64, conc, "concurrent"), (1, seq, "sequential")):
                wall, doc, cpu = fleet.check(jobs, workdir / f"{tag}{i}.db", args.timeout)
                walls.append(wall)
                for side, used in cpu.items():
                    if used is not None:
                        cpu_seen[side].append(used)
                down = [t for t in doc["targets"] if not t["reachable"]]
                missed += len(down)
                line += (
                    f" {tag} {wall:.2f} s" + (f" ({len(down)} unreachable)" if down else "") + ","
                )
                for t in down[:2]:
                    ev = t["findings"][0]["evidence"] if t["findings"] else "?"
                    print(f"    {tag}: {t['name']} unreachable: {ev}", file=sys.stderr)
            print(line.rstrip(","), file=sys.stderr)
        load_after = os.getloadavg()[0]
    finally:
        fleet.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    c, s = statistics.median(conc), statistics.median(seq)
    per_target_ms = {
        side: round(statistics.median(v) / n * 1000, 1) if v else None
        for side, v in cpu_seen.items()
    }
    cores = os.cpu_count() or 1
    # all this CPU shares the same cores: the concurrent figure cannot be lower than this
    cpu_floor_s = (
        round((per_target_ms["operator"] + per_target_ms["remote"]) * n / 1000 / cores, 2)
        if per_target_ms["operator"] and per_target_ms["remote"]
        else None
    )
    print(
        f"orch check over {n} targets ({args.hosts} hosts, +{args.delay_ms:g} ms each way), "
        f"median of {args.repeat}:"
    )
    print(f"  concurrent: {c:.2f} s")
    print(f"  sequential: {s:.2f} s")
    if missed:
        print(f"  ({missed} target answers were missing over all timed runs; see stderr)")
    print(f"  ratio:      {s / c:.1f}x   (goal: <= 2 s and >= 10x)")
    print(
        f"  CPU per target: operator {per_target_ms['operator']} ms, simulated hosts and "
        f"containers {per_target_ms['remote']} ms (all of it on {cores} cores: >= {cpu_floor_s} s); "
        f"load average {load_before:.1f} -> {load_after:.1f}"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "targets": n,
                    "unreachable_seen": missed,
                    "concurrent_s": round(c, 3),
                    "sequential_s": round(s, 3),
                    "ratio": round(s / c, 2),
                    "operator_cpu_ms_per_target": per_target_ms["operator"],
                    "remote_cpu_ms_per_target": per_target_ms["remote"],
                    "cpu_floor_s": cpu_floor_s,
                    "cores": cores,
                    "loadavg": [round(load_before, 2), round(load_after, 2)],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
