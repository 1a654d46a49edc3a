"""Latency of one observation of a container, three ways, against the sandbox (8 GPUs).

(a) seed: the incident write-ups' way. A new ``ssh`` process per poll runs
    ``pct exec 200 -- bash -c "tmux capture-pane -t train -p -S -8; echo ===;
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader"``.
    Latency = wall time from spawning ssh to its exit (the operator has the output).
(b) oneshot: ``Target.snapshot()`` (``agent snapshot``) per poll over orch's pooled
    SSH connection (agent already deployed). Latency = wall time of the call.
    ``first_oneshot_ms``: the same call after ``deploy.forget`` (what the first
    call of a new ``orch check``/``postmortem`` process pays, minus the SSH
    handshake): any "is the bundle there?" round trip shows up here.
(c) stream: the next line of a running ``agent stream`` at a short interval
    (``--stream-interval``, default 0.25 s). The agent is already running, NVML is
    initialised and the log offset is kept, so a fresh observation costs only its
    own collection plus delivery. Latency = the moment the operator holds the
    parsed Snapshot minus the moment the agent began that observation
    (``taken_at``; sandbox and operator share one clock). This is the age of
    each observation on arrival, i.e. the cost of obtaining a fresh one; an
    operator that waits for the next line additionally waits on average half
    the interval, a chosen cadence rather than a cost (printed as well).

Agent CPU ms per snapshot is the agent's own ``cost.cpu_ms`` (``time.process_time``
around collecting and encoding one snapshot), median over the stream's lines.

(d) tmux, two ways, on a private tmux server: the per-poll observation through the two raw
    tmux commands (``TmuxReader.state``) and through libtmux; the session lifecycle through
    libtmux (``start_session`` + ``kill_session``, what one launch pays); and the import of
    libtmux in a fresh ``python3 -S`` (what every one-shot agent call would pay if the
    observation imported it), as ``python3 -S -c "import libtmux"`` minus ``-c "pass"``.
    ``--tmux-only`` runs just these.

(e) the host path (real LXC containers, where this machine runs them): the next line of a
    running host observer stream (``host-stream``, one SSH channel for the host) at the same
    interval, for one container and for 8 containers of one host. Latency = the moment the
    operator holds the parsed document minus the moment the observer began it; CPU = the
    observer's own ``cost.cpu_ms`` per document (for every container of it at once).

(f) ``--compare REV``: the agent's CPU per snapshot of this tree and of commit ``REV`` in ONE
    run, interleaved (REV, this tree, this tree, REV, ...), against the same sandbox container
    (its fake NVML, its tmux session, its trainer writing a line every 0.2 s): per round each
    tree's ``agent stream`` (``cost.cpu_ms`` of every line after the first two) and ``n // 6``
    ``agent snapshot`` processes (user + system CPU from ``wait4``). Medians over all rounds,
    the ratio this/REV, and the load average before and after (other sessions share the
    machine). Both trees run from source with this interpreter (no bundle).

Usage: ``python bench/poll.py [-n 30] [--tmux-only | --host-only | --compare REV] [--json]``; the last line with ``--json`` is
``{"seed_ms", "oneshot_ms", "stream_ms", "ratio_seed_vs_stream",
"ratio_oneshot_vs_stream", "agent_cpu_ms", "first_oneshot_ms", "agent_process_cpu_ms",
"host_stream_1_ms", "host_stream_8_ms", "host_cpu_ms_1", "host_cpu_ms_8", ...}``.
``agent_process_cpu_ms`` is the user+system CPU of one whole ``agent snapshot``
process (interpreter start, imports, NVML init, observation) run directly in the
container, median over ``n``: a figure that the machine's load barely moves. Goal: a/c >= 20, CPU <= 10 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config.inventory import load_inventory
from orchestrator.remote import deploy
from orchestrator.remote.target import Target, agent_argv, parse_snapshot
from orchestrator.sandbox import manager
from orchestrator.transport.connect import close_all

SEED_REMOTE = (
    'pct exec 200 -- bash -c "tmux capture-pane -t train -p -S -8 2>/dev/null; echo ===; '
    'nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader"'
)


def seed_once(info: manager.SandboxInfo) -> float:
    """One poll the seeds' way; seconds. Raises if it did not return GPU rows."""
    argv = [
        "ssh",
        "-p",
        str(info.port),
        "-i",
        str(info.identity_file),
        "-o",
        f"UserKnownHostsFile={info.known_hosts_path}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-F",
        "/dev/null",
        f"{_user(info)}@127.0.0.1",
        SEED_REMOTE,
    ]
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    elapsed = time.perf_counter() - start
    if b"===" not in out.stdout or out.stdout.count(b" MiB") < 8:
        raise RuntimeError(
            f"seed poll failed: {out.returncode} {out.stderr[-300:]!r} {out.stdout[-300:]!r}"
        )
    return elapsed


def _user(info: manager.SandboxInfo) -> str:
    return load_inventory(info.config_path).hosts[info.host].user


def start_trainer(target: Target, workdir: str) -> None:
    """A run that logs a metrics line every 0.2 s in tmux session ``train`` (something to observe)."""
    script = (
        "mkdir -p runs/bench && echo bench > runs/current && i=0; while true; do "
        'i=$((i+1)); echo "step=$i loss=1.5 tok/s=21500" >> runs/bench/train.log; sleep 0.2; done'
    )
    res = target.transport.run(
        [
            "bash",
            "-c",
            f"cd {workdir} && tmux kill-session -t train 2>/dev/null; "
            f"tmux new-session -d -s train bash -c '{script}'",
        ]
    )
    if not res.ok:
        raise RuntimeError(f"could not start the bench trainer: {res.err}")


def agent_process_cpu_ms(info: manager.SandboxInfo, target: Target) -> float:
    """CPU (user + system, ms) of one ``agent snapshot`` process run locally as pct exec would."""
    workdir = str(info.workdir("ct200"))
    argv = agent_argv("python3", target.bundle_dir(), ["snapshot", "--workdir", workdir])
    env = {**os.environ, **manager.host_env(info.state_dir)}
    env["TMUX_TMPDIR"] = str(info.container_root(200) / "tmp")  # as pct exec sets it
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    pid = os.posix_spawnp(argv[0], argv, env, file_actions=quiet)  # wait4: this child's rusage
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"agent snapshot exited {status}")
    return (usage.ru_utime + usage.ru_stime) * 1000


def _process_ms(code: str, env: dict[str, str]) -> float:
    """Wall ms of one fresh ``python3 -S -c CODE`` (the bundle's way of running the agent)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-S", "-c", code], env=env, check=True, timeout=60)
    return (time.perf_counter() - start) * 1000


def tmux_figures(n: int) -> dict[str, float]:
    """(d): raw tmux vs libtmux, per observation and per lifecycle, on a private server."""
    from orchestrator.agent import tmux as agent_tmux

    saved = os.environ.get("TMUX_TMPDIR")
    os.environ["TMUX_TMPDIR"] = tempfile.mkdtemp(prefix="orch-bench-tmux-")
    try:
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", "obs", "sh", "-c", "seq 1 50; sleep 600"],
            check=True,
            timeout=10,
        )
        reader = agent_tmux.TmuxReader()
        server = agent_tmux._server()  # libtmux imported once here, as a launch does

        def raw() -> float:
            start = time.perf_counter()
            state = reader.state("obs", 8)
            assert state.exists and state.pane_tail, state
            return (time.perf_counter() - start) * 1000

        def with_libtmux() -> float:
            start = time.perf_counter()
            pane = server.sessions.get(session_name="obs").active_window.active_pane
            fields = pane.cmd("display-message", "-p", agent_tmux.PANE_FORMAT).stdout
            tail = pane.capture_pane(start=-50)
            assert fields and tail
            return (time.perf_counter() - start) * 1000

        def lifecycle() -> float:
            start = time.perf_counter()
            pane = agent_tmux.start_session("life", "/tmp", "sleep 600", {"A": "1"})
            agent_tmux.kill_session("life")
            assert pane.remain_on_exit == "on"
            return (time.perf_counter() - start) * 1000

        for _ in range(2):
            raw(), with_libtmux(), lifecycle()
        raw_ms = [raw() for _ in range(n)]
        lib_ms = [with_libtmux() for _ in range(n)]
        life_ms = [lifecycle() for _ in range(n)]
        env = {**os.environ, "PYTHONPATH": str(Path(agent_tmux.__file__).parents[2])}
        site = str(Path(sys.modules["libtmux"].__file__ or "").parents[1])
        env["PYTHONPATH"] += os.pathsep + site  # -S: the bundle puts libtmux on sys.path itself
        base = [_process_ms("pass", env) for _ in range(n)]
        imp = [_process_ms("import libtmux", env) for _ in range(n)]
        obs = [
            _process_ms(
                "from orchestrator.agent.tmux import TmuxReader; TmuxReader().state('obs', 8)", env
            )
            for _ in range(n)
        ]
        subprocess.run(["tmux", "kill-server"], check=False, timeout=10)
    finally:
        if saved is None:
            os.environ.pop("TMUX_TMPDIR", None)
        else:
            os.environ["TMUX_TMPDIR"] = saved
    med = statistics.median
    return {
        "tmux_raw_observation_ms": round(med(raw_ms), 2),
        "tmux_libtmux_observation_ms": round(med(lib_ms), 2),
        "tmux_libtmux_lifecycle_ms": round(med(life_ms), 2),
        "libtmux_import_ms": round(med(imp) - med(base), 1),
        "tmux_raw_oneshot_process_ms": round(med(obs), 1),
        "python_start_ms": round(med(base), 1),
    }


def print_tmux(fig: dict[str, float]) -> None:
    print(
        f"(d) tmux    observation, two raw commands          : median "
        f"{fig['tmux_raw_observation_ms']:8.1f} ms"
    )
    print(
        f"            observation through libtmux            : median "
        f"{fig['tmux_libtmux_observation_ms']:8.1f} ms"
    )
    print(
        f"            lifecycle through libtmux (start+kill) : median "
        f"{fig['tmux_libtmux_lifecycle_ms']:8.1f} ms"
    )
    print(
        f"            import libtmux in a fresh python3 -S   : median "
        f"{fig['libtmux_import_ms']:8.1f} ms (python start {fig['python_start_ms']} ms; one-shot "
        f"raw observation process {fig['tmux_raw_oneshot_process_ms']} ms)"
    )


def host_path_figures(n: int, interval_s: float) -> dict[str, float]:
    """(e): the host observer's stream for 1 and for 8 containers of one host (LXC)."""
    from orchestrator.remote.hostlink import HostLink, parse_host_document
    from orchestrator.remote.target import parse_document
    from orchestrator.sandbox import lxc

    why = lxc.unavailable()
    if why is not None:
        print(f"(e) host path: skipped, LXC containers cannot run here ({why})")
        return {}
    state = Path(tempfile.mkdtemp(prefix="orch-bench-poll-host-"))
    info = manager.up(state, containers=8, gpus=8, scenario="healthy", isolation="lxc")
    out: dict[str, float] = {}
    try:
        inv = load_inventory(info.config_path)
        names = [f"ct{v}" for v in info.vmids]
        for name in names:
            start_trainer(Target(inv, name), "/root/dflash")
        for group, tag in ((names[:1], "1"), (names, "8")):
            link = HostLink(inv, info.host, group)
            ages, cpu = [], []
            stream = link.open_stream(interval_s)
            try:
                skip = 2  # the first documents pay for NVML init, pct and the log tails
                while len(ages) < n:
                    line = stream.readline(timeout=30)
                    if line is None:
                        raise RuntimeError(f"the host stream ended: {stream.stderr_tail[-300:]!r}")
                    now = time.time()
                    doc = parse_host_document(info.host, parse_document(info.host, line))
                    if skip:
                        skip -= 1
                        continue
                    assert len(doc.containers) == len(group) and len(doc.gpus) == 8
                    ages.append((now - doc.taken_at) * 1000)
                    cpu.append(doc.cost.cpu_ms if doc.cost else float("nan"))
            finally:
                stream.close()
            out[f"host_stream_{tag}_ms"] = round(statistics.median(ages), 2)
            out[f"host_cpu_ms_{tag}"] = round(statistics.median(cpu), 2)
    finally:
        close_all()
        manager.down(state)
    print(
        f"(e) host    next stream line, 1 container           : median "
        f"{out['host_stream_1_ms']:8.1f} ms (observer CPU {out['host_cpu_ms_1']} ms a line)"
    )
    print(
        f"            next stream line, 8 containers          : median "
        f"{out['host_stream_8_ms']:8.1f} ms (observer CPU {out['host_cpu_ms_8']} ms a line, "
        f"{out['host_cpu_ms_8'] / 8:.2f} ms a container)"
    )
    return out


def _agent(tree: Path, args: list[str], env: dict[str, str]) -> list[str]:
    """``python -m orchestrator.agent ARGS`` from ``tree`` (its own ``orchestrator``)."""
    env = {**env, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.agent", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.splitlines()


def _snapshot_process_cpu_ms(tree: Path, args: list[str], env: dict[str, str]) -> float:
    argv = [sys.executable, "-m", "orchestrator.agent", "snapshot", *args]
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    pid = os.posix_spawn(argv[0], argv, {**env, "PYTHONPATH": str(tree)}, file_actions=quiet)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"agent snapshot from {tree} exited {status}")
    return (usage.ru_utime + usage.ru_stime) * 1000


def compare_agents(rev: str, n: int, interval_s: float) -> dict[str, object]:
    """(f): this tree's agent against ``rev``'s, interleaved, on one sandbox container."""
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-compare-"))
    base = tmp / "base"
    base.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "orchestrator"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True, timeout=60)
    trees = {"base": base, "this": root}
    state = tmp / "sandbox"
    info = manager.up(state, containers=1, gpus=8, scenario="healthy", isolation="process")
    load = [os.getloadavg()]
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    proc: dict[str, list[float]] = {k: [] for k in trees}
    rounds = 6
    per_round = max(5, n // rounds)
    try:
        inv = load_inventory(info.config_path)
        workdir = str(info.workdir("ct200"))
        start_trainer(Target(inv, "ct200"), workdir)
        env = {**os.environ, **manager.host_env(info.state_dir)}
        env["TMUX_TMPDIR"] = str(info.container_root(200) / "tmp")
        obs = ["--workdir", workdir]
        stream = [
            "stream",
            *obs,
            "--interval",
            str(interval_s),
            "--ignore-stdin",
            "--count",
            str(per_round + 2),
        ]
        for tree in trees.values():  # warm the page cache and the bytecode of both
            _agent(tree, ["snapshot", *obs], env)
        for r in range(rounds):
            for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                lines = _agent(trees[name], stream, env)[2:]
                docs = [json.loads(x) for x in lines]
                assert all(len(d["gpus"]) == 8 and d["metrics"] for d in docs), docs[-1]
                cpu[name] += [d["cost"]["cpu_ms"] for d in docs]
                proc[name] += [
                    _snapshot_process_cpu_ms(trees[name], obs, env) for _ in range(max(3, n // 6))
                ]
        load.append(os.getloadavg())
    finally:
        close_all()
        manager.down(state)
    med = statistics.median
    fig = {
        "rev": rev,
        "agent_cpu_ms_base": round(med(cpu["base"]), 3),
        "agent_cpu_ms_this": round(med(cpu["this"]), 3),
        "agent_cpu_ratio": round(med(cpu["this"]) / med(cpu["base"]), 3),
        "agent_process_cpu_ms_base": round(med(proc["base"]), 1),
        "agent_process_cpu_ms_this": round(med(proc["this"]), 1),
        "agent_process_cpu_ratio": round(med(proc["this"]) / med(proc["base"]), 3),
        "stream_lines_each": len(cpu["base"]),
        "processes_each": len(proc["base"]),
        "loadavg_before": [round(x, 2) for x in load[0]],
        "loadavg_after": [round(x, 2) for x in load[-1]],
    }
    print(
        f"(f) agent CPU per snapshot, interleaved, {rounds} rounds ({fig['stream_lines_each']} "
        f"stream lines, {fig['processes_each']} snapshot processes each)"
    )
    print(
        f"            stream   {rev:>10}: median {fig['agent_cpu_ms_base']:7.3f} ms   this tree: "
        f"{fig['agent_cpu_ms_this']:7.3f} ms   ratio {fig['agent_cpu_ratio']:.3f}"
    )
    print(
        f"            snapshot {rev:>10}: median {fig['agent_process_cpu_ms_base']:7.1f} ms   "
        f"this tree: {fig['agent_process_cpu_ms_this']:7.1f} ms   ratio "
        f"{fig['agent_process_cpu_ratio']:.3f}"
    )
    print(f"            load average before {fig['loadavg_before']}, after {fig['loadavg_after']}")
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30, help="samples per way (>= 30)")
    ap.add_argument("--stream-interval", type=float, default=0.25, help="stream interval (s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--tmux-only", action="store_true", help="only (d): raw tmux vs libtmux")
    ap.add_argument("--host-only", action="store_true", help="only (e): the host observer")
    ap.add_argument(
        "--compare",
        metavar="REV",
        default=None,
        help="only (f): this tree's agent CPU against REV's, interleaved",
    )
    args = ap.parse_args(argv)
    n = max(args.n, 30)
    if args.compare:
        fig = compare_agents(args.compare, n, args.stream_interval)
        if args.json:
            print(json.dumps({**fig, "samples": n}))
        return 0
    if args.host_only:
        print(f"samples: {n}")
        host_fig = host_path_figures(n, args.stream_interval)
        if args.json:
            print(json.dumps({**host_fig, "samples": n}))
        return 0
    tmux_fig = tmux_figures(n)
    if args.tmux_only:
        print(f"samples: {n}")
        print_tmux(tmux_fig)
        if args.json:
            print(json.dumps({**tmux_fig, "samples": n}))
        return 0
    state = Path(tempfile.mkdtemp(prefix="orch-bench-poll-"))
    # process mode: the agent is timed as a local process with the container's variables
    info = manager.up(state, containers=1, gpus=8, scenario="healthy", isolation="process")
    try:
        inv = load_inventory(info.config_path)
        target = Target(inv, "ct200")
        start_trainer(target, str(info.workdir("ct200")))
        target.bundle_dir()
        for _ in range(2):  # warm: connection, page cache
            seed_once(info)
            target.snapshot()

        seed = [seed_once(info) * 1000 for _ in range(n)]

        oneshot, oneshot_cpu = [], []
        for _ in range(n):
            start = time.perf_counter()
            snap = target.snapshot()
            oneshot.append((time.perf_counter() - start) * 1000)
            assert len(snap.gpus) == 8 and snap.nvml.ok, snap.nvml
            oneshot_cpu.append(snap.cost.cpu_ms)

        first_call = []
        for _ in range(n):
            deploy.forget(target.transport, str(info.workdir("ct200")))
            start = time.perf_counter()
            target.snapshot()
            first_call.append((time.perf_counter() - start) * 1000)

        proc_cpu = [agent_process_cpu_ms(info, target) for _ in range(n)]

        stream_ms, stream_cpu, gaps = [], [], []
        line_stream = target.open_stream(args.stream_interval)
        try:
            last = None
            first = True
            while len(stream_ms) < n:
                line = line_stream.readline(timeout=30)
                if line is None:
                    raise RuntimeError("the stream ended early")
                now = time.time()
                snap = parse_snapshot("ct200", line)
                if first:  # the first line pays for NVML init and the log tail
                    first = False
                    continue
                assert len(snap.gpus) == 8 and snap.nvml.ok
                stream_ms.append((now - snap.taken_at) * 1000)
                stream_cpu.append(snap.cost.cpu_ms)
                if last is not None:
                    gaps.append((now - last) * 1000)
                last = now
        finally:
            line_stream.close()
    finally:
        close_all()
        manager.down(state)

    med = statistics.median
    seed_ms, one_ms, st_ms = med(seed), med(oneshot), med(stream_ms)
    result = {
        "seed_ms": round(seed_ms, 2),
        "oneshot_ms": round(one_ms, 2),
        "stream_ms": round(st_ms, 2),
        "ratio_seed_vs_stream": round(seed_ms / st_ms, 1),
        "ratio_oneshot_vs_stream": round(one_ms / st_ms, 1),
        "agent_cpu_ms": round(med(stream_cpu), 2),
        "agent_cpu_ms_oneshot": round(med(oneshot_cpu), 2),
        "first_oneshot_ms": round(med(first_call), 2),
        "agent_process_cpu_ms": round(med(proc_cpu), 1),
        "stream_interval_ms": args.stream_interval * 1000,
        "stream_gap_ms": round(med(gaps), 1),
        **tmux_fig,
        "samples": n,
    }
    print(f"samples per way: {n} (sandbox: 8 GPUs, ssh to 127.0.0.1:{info.port})")
    print(f"(a) seed    new ssh + pct exec + tmux + nvidia-smi : median {seed_ms:8.1f} ms")
    print(f"(b) oneshot agent snapshot over pooled ssh         : median {one_ms:8.1f} ms")
    print(
        f"    first call of a process (deploy cache empty)    : median "
        f"{result['first_oneshot_ms']:8.1f} ms"
    )
    print(
        f"    one agent snapshot process, CPU user+sys        : median "
        f"{result['agent_process_cpu_ms']:8.1f} ms"
    )
    print(
        f"(c) stream  next line, age on arrival              : median {st_ms:8.1f} ms "
        f"(lines every {result['stream_gap_ms']} ms; interval {args.stream_interval * 1000:.0f} ms)"
    )
    print(
        f"ratio a/c = {result['ratio_seed_vs_stream']}x (goal >= 20), "
        f"b/c = {result['ratio_oneshot_vs_stream']}x"
    )
    print(
        f"agent CPU per snapshot: {result['agent_cpu_ms']} ms in stream (goal <= 10), "
        f"{result['agent_cpu_ms_oneshot']} ms one-shot"
    )
    print_tmux(tmux_fig)
    result.update(host_path_figures(n, args.stream_interval))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
