"""The host observer on real LXC containers (orchestrator/agent/host.py, orchestrator/remote/hostlink.py).

A private sandbox (two LXC containers, 8 GPUs) because these tests stop, delete and restart
containers. What is checked: one document covers both containers as their in-container
snapshot would; GPU processes (host PIDs from NVML) are mapped to their container, their PID
inside and their name, also when the host PID collides with another process inside; a
container stopped, deleted or restarted mid-stream is shown as such and the stream goes
on; files planted by the container's root leak no host byte; kernel events go to the
container they belong to (seed 000's ghost GPU, an OOM kill and Xids with two containers).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SANDBOX_ISOLATION, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.unprivileged]
ROOT = Path(__file__).resolve().parents[2]
LOOP = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500"; sleep 0.5; done'


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from orchestrator.sandbox import manager
    from orchestrator.transport.connect import close_all

    if SANDBOX_ISOLATION == "process":
        pytest.skip("the host observer needs real containers (LXC)")
    state_dir = tmp_path_factory.mktemp("hostobs")
    info = manager.up(state_dir, containers=2, gpus=8, scenario="idle", isolation=SANDBOX_ISOLATION)
    if info.isolation != "lxc":
        manager.down(state_dir)
        pytest.skip(f"LXC containers cannot run here: {info.fallback}")
    try:
        yield info
    finally:
        close_all()
        manager.down(state_dir)


def inventory(info):
    from orchestrator.config.inventory import load_inventory

    return load_inventory(Path(info.config_path))


def orch(info, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "-c", str(info.config_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def observe(info, *names: str):
    from orchestrator.remote.hostlink import HostLink

    return HostLink(inventory(info), "sandbox", list(names or ("ct200", "ct201"))).observe()


def launch(info, name: str, cmd: str = LOOP) -> str:
    from orchestrator.remote.target import Target

    inv = inventory(info)
    c = inv.container(name)
    doc = Target(inv, name).agent(
        [
            "launch",
            "--workdir",
            c.workdir,
            "--session",
            c.session,
            "--cmd",
            cmd,
            "--no-recorder",
            "--force",
            "--grace",
            "2",
        ],
        timeout=60,
    )
    assert doc.get("ok"), doc
    return str(doc["run_id"])


def start_inside(info, name: str, *argv: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """Run ``argv`` in container ``name`` through its pct; (the pct process, host PID, PID inside)."""
    env = {**os.environ, **info.env(), "PATH": f"{info.state_dir / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [str(info.state_dir / "bin" / "pct"), "exec", name[2:], "--", *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    want = [a.encode() for a in argv]

    def found() -> int | None:
        for pid in info.container_pids(name):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[: len(want)] == want:
                    return pid
            except OSError:
                continue
        return None

    host = wait_for(found, 20, what=f"{argv} in {name}")
    status = Path(f"/proc/{host}/status").read_text()
    inner = int(next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1])
    return proc, host, inner


def gpu3_held_by(info, pid: int, used_mib: float = 0.0, driver: str | None = None) -> None:
    """The ghost scenario (GPU 3 at 100 % with 0 MiB) with ``pid`` (a HOST PID) on GPU 3;
    ``driver`` replaces the scenario's driver version."""
    from orchestrator.sandbox import manager

    _name, doc = manager.load_scenario("ghost")
    doc["devices"][3]["processes"] = [{"pid": pid, "used_mib": used_mib}]
    if driver is not None:
        doc["driver_version"] = driver
    manager.set_scenario(info.state_dir, {**doc, "name": "ghost-held"})


def test_one_document_covers_every_container_as_it_sees_itself(ct) -> None:
    from orchestrator.remote.target import Target

    run_id = launch(ct, "ct200")
    wait_for(
        lambda: "step=3" in (ct.workdir("ct200") / "runs" / run_id / "train.log").read_text(),
        20,
        what="the loop's third step",
    )
    doc = observe(ct)
    inside = Target(inventory(ct), "ct200").snapshot()
    mine, idle = doc.containers["ct200"], doc.containers["ct201"]
    assert mine.source == "host" and mine.container_status == "running" and mine.vmid == 200
    assert mine.run is not None and inside.run is not None and mine.run.run_id == inside.run.run_id
    assert mine.run.log_exists and mine.metrics is not None and mine.metrics.step
    assert mine.session.server_running and mine.session.exists and not mine.session.pane_dead
    assert mine.session.pane_pid == inside.session.pane_pid  # the pane's PID inside
    wrapper = next(p for p in mine.processes if p.pid == mine.session.pane_pid)
    assert wrapper.host_pid == ct.host_pid("ct200", wrapper.pid)
    assert {"bash", "tee"} <= {p.name for p in mine.processes}
    assert idle.run is None and idle.container_status == "running"
    assert doc.visible_gpus["ct200"] == tuple(range(8))
    assert doc.cost is not None and doc.cost.cpu_ms < 2000


def test_gpu_processes_are_mapped_to_their_container_and_pid_inside(ct) -> None:
    proc, host, inner = start_inside(ct, "ct201", "sleep", "600.5")
    try:
        gpu3_held_by(ct, host)
        doc = observe(ct)
        (p,) = doc.gpus[3].processes or ()
        assert (p.pid, p.vmid, p.container_pid, p.name, p.container) == (
            host,
            201,
            inner,
            "sleep",
            "ct201",
        )
    finally:
        proc.kill()
        proc.wait(10)


def _proc_text(pid: object, name: str) -> str | None:
    """``/proc/PID/NAME``, or None when the process exited while we listed it (a container's
    short-lived processes come and go between the listing and the read)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_a_host_pid_colliding_inside_is_named_from_the_host(ct) -> None:
    """NVML inside gives host PIDs (a driver before 535.113.01, as the version says); one that
    is another process inside must not take its name. With a newer driver's version the PID
    would be the container's own (gpupids.decide_numbering), so the old one is set here: with
    570's, the answer depended on whether the clashing process inside was still there."""
    from orchestrator.remote.target import Target

    inner_pids = {}
    for h in ct.container_pids("ct200"):
        status = _proc_text(h, "status")
        if status is not None and "NSpid:" in status:
            inner_pids[status.split("NSpid:")[1].split()[-1]] = h
    clash = next(
        (
            int(pid)
            for pid, host in sorted(inner_pids.items(), key=lambda x: int(x[0]))
            if int(pid) > 2
            and (comm := _proc_text(pid, "comm")) is not None
            and (host_comm := _proc_text(host, "comm")) is not None
            and comm != host_comm
        ),
        None,
    )
    if clash is None:
        pytest.skip("no PID of ct200 is also a host PID of another process right now")
    gpu3_held_by(ct, clash, used_mib=100.0, driver="535.104.05")
    inside = Target(inventory(ct), "ct200").snapshot()
    (seen,) = inside.gpus[3].processes or ()
    assert seen.pid == clash and seen.name is None  # not the container's own process's name
    (host_seen,) = observe(ct).gpus[3].processes or ()
    assert host_seen.name == Path(f"/proc/{clash}/comm").read_text().strip()
    assert host_seen.vmid is None  # a host process, not ct200's


def ghosts(info, db: Path) -> dict[str, list[dict]]:
    """Ghost findings by target after as many checks as the detector needs samples."""
    from orchestrator.config.limits import Limits

    for _ in range(Limits().ghost_samples):
        doc = json.loads(orch(info, "check", "--json", "--db", str(db)).stdout)
    return {
        t["name"]: [f for f in t["findings"] if f["kind"] == "ghost-utilization"]
        for t in doc["targets"]
    }


def test_seed_000_answered_from_the_host(ct, tmp_path) -> None:
    """GPU 3 at 100 % with 0 MiB and no process on the host's list: a critical ghost; the same
    reading with a process of ct201 on it names ct201 on ct200 (and is ct201's own there)."""
    from orchestrator.sandbox import manager

    manager.set_scenario(ct.state_dir, "ghost")
    ghost = ghosts(ct, tmp_path / "a.db")
    assert ghost["ct200"][0]["severity"] == "critical" and ghost["ct200"][0]["gpus"] == [3]
    assert "the host lists none" in ghost["ct200"][0]["summary"]
    proc, host, inner = start_inside(ct, "ct201", "sleep", "600.6")
    try:
        gpu3_held_by(ct, host)
        ghost = ghosts(ct, tmp_path / "b.db")
    finally:
        proc.kill()
        proc.wait(10)
    theirs = ghost["ct200"][0]
    assert theirs["severity"] == "critical" and f"sleep (pid {inner} in ct201)" in theirs["summary"]
    assert ghost["ct201"][0]["severity"] == "warning"  # its own process holds it


def test_events_go_to_the_container_they_belong_to(ct, tmp_path) -> None:
    """An OOM kill in ct201's memory cgroup and an Xid on the GPU ct201's process holds are
    ct201's findings, not ct200's; an Xid on a GPU nobody holds or claims is the host's."""
    from orchestrator.sandbox import kernel

    db = tmp_path / "orch.db"
    orch(ct, "check", "--json", "--db", str(db))
    proc, host, inner = start_inside(ct, "ct201", "sleep", "600.7")
    try:
        gpu3_held_by(ct, host, used_mib=2048.0)
        memcg = Path(f"/proc/{host}/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
        kernel.append_kernel_line(
            ct.state_dir,
            f"oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg={memcg},task=sleep,pid={host},uid=0",
            level=6,
        )
        kernel.append_kernel_line(
            ct.state_dir,
            f"Memory cgroup out of memory: Killed process "
            f"{host} (sleep) total-vm:1kB, anon-rss:1kB",
            level=3,
        )
        kernel.append_kernel_line(
            ct.state_dir,
            "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.",
            level=3,
        )
        kernel.append_kernel_line(
            ct.state_dir,
            "NVRM: Xid (PCI:0000:bb:00): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.",
            level=3,
        )
        doc = json.loads(orch(ct, "check", "--json", "--db", str(db)).stdout)
    finally:
        proc.kill()
        proc.wait(10)
    kinds = {t["name"]: {f["kind"] for f in t["findings"]} for t in doc["targets"]}
    assert {"oom-killer", "xid"} <= kinds["ct201"], doc
    assert not {"oom-killer", "xid"} & kinds["ct200"], doc
    (host_row,) = doc["hosts"]
    assert [f["kind"] for f in host_row["findings"]] == ["xid"]
    assert "0000:bb:00" in host_row["findings"][0]["summary"]


def test_planted_symlinks_leak_no_host_byte(ct, tmp_path) -> None:
    """ct200's root user points the run's files at a host file: nothing of it comes back."""
    canary = tmp_path / "canary-host-only"
    canary.write_text("HOST-CANARY-58d1 must never leave this machine\n")
    runs = ct.workdir("ct200") / "runs"
    evil = runs / "evil"
    evil.mkdir(parents=True, exist_ok=True)
    (evil / "train.log").symlink_to(canary)
    (evil / "manifest.json").symlink_to("../../../../../../../../" + str(canary).lstrip("/"))
    (evil / "exit_status").symlink_to(canary)
    (runs / "lair").symlink_to(tmp_path)  # a symlinked directory
    (runs / "lair-run").mkdir(exist_ok=True)
    current = runs / "current"
    saved = current.read_text() if current.exists() else None
    try:
        for target in ("evil", "lair"):
            current.unlink(missing_ok=True)
            current.write_text(target + "\n")
            if target == "lair":  # runs/lair/train.log is the host's tmp dir's file
                (tmp_path / "train.log").write_text(canary.read_text())
            doc = observe(ct, "ct200")
            assert "HOST-CANARY-58d1" not in json.dumps(doc.to_dict())
            res = orch(ct, "check", "ct200", "--json", "--db", str(tmp_path / "c.db"))
            assert "HOST-CANARY-58d1" not in res.stdout + res.stderr
        current.unlink()
        current.symlink_to(canary)  # runs/current itself
        assert "HOST-CANARY-58d1" not in json.dumps(observe(ct, "ct200").to_dict())
    finally:
        current.unlink(missing_ok=True)
        if saved is not None:
            current.write_text(saved)


def test_a_container_stopped_deleted_or_restarted_mid_stream(ct) -> None:
    from orchestrator.remote.hostlink import HostLink, HostStreamLost
    from orchestrator.sandbox import manager

    link = HostLink(inventory(ct), "sandbox", ["ct200", "ct201"])
    docs: list = []
    lost: list[str] = []
    stop = threading.Event()

    def read() -> None:
        it = link.stream_once(0.3)
        try:
            for d in it:
                docs.append(d)
                if stop.is_set():
                    break
        except HostStreamLost as exc:
            lost.append(str(exc))
        finally:
            it.close()

    th = threading.Thread(target=read, daemon=True)
    th.start()

    def status_is(word: str) -> object:
        return docs and docs[-1].containers["ct201"].container_status == word and docs[-1]

    conf = ct.state_dir / "etc" / "pve" / "lxc" / "201.conf"
    try:
        wait_for(lambda: status_is("running"), 30, what="a first document")
        first_init = ct.init_pid("ct201")
        manager.stop_container(ct.state_dir, "ct201")
        wait_for(lambda: status_is("stopped"), 30, what="ct201 stopped")
        conf.rename(conf.with_suffix(".gone"))  # deleted: pct has no config for it
        wait_for(lambda: status_is("missing"), 30, what="ct201 missing")
        conf.with_suffix(".gone").rename(conf)
        manager.start_container(ct.state_dir, "ct201")
        d = wait_for(lambda: status_is("running"), 30, what="ct201 running again")
        assert ct.init_pid("ct201") != first_init
        assert d.containers["ct200"].container_status == "running"
        assert not lost, lost
    finally:
        stop.set()
        if conf.with_suffix(".gone").exists():
            conf.with_suffix(".gone").rename(conf)
        th.join(10)
    wait_for(
        lambda: manager.run_pct(ct.state_dir, "status", "201").stdout.strip() == "status: running",
        10,
        what="ct201 back",
    )


def test_a_cold_observer_asks_lxc_not_pct(ct) -> None:
    """With no kept init PIDs (the first check of a host) the running containers' state and
    init PIDs come from LXC (command sockets, ``lxc-info -p``), as pct itself learns them:
    with every pct call costing 3 s of CPU, the whole document still costs less than one."""
    inv = inventory(ct)
    kept = Path(inv.hosts["sandbox"].agent_dir) / ".orch" / "containers.json"
    knob = Path(ct.state_dir) / "pct_cpu_s"
    knob.write_text("3\n")
    try:
        kept.unlink(missing_ok=True)
        doc = observe(ct)
    finally:
        knob.unlink()
    assert {s.container_status for s in doc.containers.values()} == {"running"}
    assert doc.cost is not None and doc.cost.cpu_ms < 3000, doc.cost
    assert json.loads(kept.read_text()).keys() == {"200", "201"}


def test_the_journal_is_read_only_when_it_moved(ct, tmp_path, monkeypatch) -> None:
    """A check passing the cursor the previous one ended at, while the journal's files have
    not moved, runs no journalctl (with none on PATH it still says nothing went wrong); a
    line written afterwards is read by the next check, after that same cursor."""
    from orchestrator.agent.host import ContainerSpec, HostObserver
    from orchestrator.sandbox import kernel
    from orchestrator.sandbox.control import _local_env

    for k, v in _local_env(Path(ct.state_dir)).items():
        monkeypatch.setenv(k, v)
    specs = [ContainerSpec("ct200", 200, "/root/dflash")]
    state = str(tmp_path / "containers.json")

    def check(cursor: str | None):
        obs = HostObserver(
            specs, host="sandbox", cursor=cursor, since=None if cursor else 0.0, state_path=state
        )
        try:
            return obs.observe()
        finally:
            obs.close()

    first = check(None)
    assert first.kernel_log_source == "journalctl" and first.kernel_cursor
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", "/nonexistent")  # neither journalctl nor dmesg to be found
    quiet = check(first.kernel_cursor)
    assert quiet.kernel_events == () and not quiet.errors, quiet.errors
    assert quiet.kernel_cursor == first.kernel_cursor
    monkeypatch.setenv("PATH", path)
    kernel.append_kernel_line(
        ct.state_dir,
        "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.",
        level=3,
    )
    moved = check(first.kernel_cursor)
    assert [e.xid for e in moved.kernel_events] == [79]
    assert moved.kernel_cursor != first.kernel_cursor


def test_over_ssh_the_next_check_is_served_by_the_resident(ct) -> None:
    """Through the sandbox's sshd, as ``orch check`` runs the observer: with no resident, the
    one-shot answers and starts one, which outlives the SSH channel (the call returns) and
    answers the next check with the same document (orchestrator/agent/resident.py)."""
    from orchestrator.remote.hostlink import HostLink, parse_host_document
    from orchestrator.remote.target import parse_answer

    agent_dir = Path(inventory(ct).hosts["sandbox"].agent_dir)
    for lock in agent_dir.glob(".orch/*/observer-*.lock"):
        pid = int(lock.read_text().strip() or 0)
        with contextlib.suppress(OSError):
            if b"orchestrator.agent.resident" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                gone = Path(f"/proc/{pid}")
                wait_for(lambda p=gone: not p.exists(), 10, what="no resident")
    link = HostLink(inventory(ct), "sandbox", ["ct200", "ct201"])

    def check() -> dict:
        res = link._run(link._request().to_argv(), 60)
        assert res.ok, res.err
        return parse_answer("sandbox", res)

    first = check()
    assert first["served_by"] == "oneshot"
    later = wait_for(lambda: (d := check())["served_by"] == "resident" and d, 30, what="resident")
    a, b = parse_host_document("sandbox", first), parse_host_document("sandbox", later)
    assert a.container_status == b.container_status == {200: "running", 201: "running"}
    assert {n: s.run and s.run.run_id for n, s in a.containers.items()} == {
        n: s.run and s.run.run_id for n, s in b.containers.items()
    }
    assert (
        a.nvml
        and b.nvml
        and (a.nvml.ok, a.nvml.driver_version) == (b.nvml.ok, b.nvml.driver_version)
    )
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus] and len(a.gpus) == 8
