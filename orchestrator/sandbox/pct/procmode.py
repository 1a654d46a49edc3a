"""pct over process-mode containers (no namespaces; orchestrator/sandbox/process.py).

A container is the directory ``<state>/containers/<vmid>/`` (its "/"), its ``status`` file
and a cgroup leaf; its "files" that a real container would have (its own /tmp for
tmux, the fake NVML, its /root) are simulated by variables ``exec`` sets. Because
they stand for files, they survive an ``env -i`` at the head of the command (how orch
passes a clean environment): they are laid in again after its assignments.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

STATUS_RUNNING, STATUS_STOPPED = "running", "stopped"


class ProcessBackend:
    """Process-mode containers of the sandbox in ``state``."""

    def __init__(self, state: str) -> None:
        self.state = state

    def root(self, vmid: int) -> str:
        return os.path.join(self.state, "containers", str(vmid))

    def _meta(self, vmid: int, name: str) -> str:
        try:
            with open(os.path.join(self.root(vmid), name), encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return ""

    def _set_status(self, vmid: int, value: str) -> None:
        path = os.path.join(self.root(vmid), "status")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(value + "\n")
        os.replace(tmp, path)

    def running(self, vmid: int) -> bool:
        return self._meta(vmid, "status") == STATUS_RUNNING

    def simulated(self, vmid: int) -> dict[str, str]:
        """The variables that stand for the container's own files."""
        root = self.root(vmid)
        lib = os.path.join(self.state, "lib")
        old_lib = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != lib]
        return {
            "container": "lxc",
            "HOME": os.path.join(root, "root"),
            "LD_LIBRARY_PATH": ":".join([lib, *old_lib]),
            "ORCH_FAKE_NVML_SCENARIO": os.path.join(self.state, "driver", "scenario.json"),
            "TMUX_TMPDIR": os.path.join(root, "tmp"),
            "ORCH_SANDBOX_VMID": str(vmid),
            "ORCH_SANDBOX_CT": f"{self.state}:{vmid}",
        }

    def exec(self, vmid: int, keep_env: bool, argv: list[str], env: dict[str, str]) -> int:
        ours = self.simulated(vmid)
        bin_dir = os.path.join(self.root(vmid), "usr", "bin")
        if keep_env:
            child_env = {k: v for k, v in env.items() if k != "ORCH_SANDBOX_STATE"}
            child_env.update(ours, PATH=f"{bin_dir}:{env['PATH']}")
        else:  # --clear-env: container=lxc and PATH (plus what simulates the container's files)
            ours.pop("HOME")
            child_env = {**ours, "PATH": f"{bin_dir}:{env['PATH']}"}
        argv = reinject(argv, ours, bin_dir)
        cgroup = self._meta(vmid, "cgroup")
        pid = os.fork()
        if pid == 0:  # the attached process
            try:
                if cgroup:
                    join_cgroup(cgroup)
                with contextlib.suppress(OSError):
                    os.chdir(ours.get("HOME") or os.path.join(self.root(vmid), "root"))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                os.execvpe(argv[0], argv, child_env)
            except OSError as exc:
                sys.stderr.write(
                    f"lxc-attach: {vmid}: ../src/lxc/attach.c: lxc_attach_run_command: 1841 "
                    f'{exc.strerror} - Failed to exec "{argv[0]}"\n'
                )
                sys.stderr.flush()
                os._exit(126 if exc.errno in (13, 8) else 127)
            os._exit(127)
        # as lxc-attach without a pty: no signal is forwarded; a killed pct leaves the child
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except ChildProcessError:
                return 255
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return os.WEXITSTATUS(status)

    def enter(self, vmid: int, unprivileged: bool = False) -> None:
        """Nothing to enter: :meth:`path` maps container paths into the container's directory."""

    def path(self, vmid: int, path: str) -> str:
        """A container path as a host path (one already inside the container dir stays)."""
        root = self.root(vmid)
        absolute = os.path.abspath(os.path.join(root, path.lstrip("/")))
        if path.startswith(root + os.sep):
            return os.path.abspath(path)
        return absolute

    def members(self, vmid: int) -> set[int]:
        """Every process of the container: its cgroup's members and those carrying its marker."""
        found: set[int] = set()
        cgroup = self._meta(vmid, "cgroup")
        if cgroup and os.path.isdir(cgroup):
            for dirpath, _dirs, files in os.walk(cgroup):
                if "cgroup.procs" in files:
                    with (
                        contextlib.suppress(OSError),
                        open(os.path.join(dirpath, "cgroup.procs")) as fh,
                    ):
                        found.update(int(p) for p in fh.read().split())
        want = f"ORCH_SANDBOX_CT={self.state}:{vmid}".encode()
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        found.add(int(name))
        found.discard(os.getpid())
        return found

    def start(self, vmid: int) -> None:
        cgroup = self._meta(vmid, "cgroup")
        if cgroup:
            join_cgroup(cgroup, join=False)
        os.makedirs(os.path.join(self.root(vmid), "tmp"), exist_ok=True)
        self._set_status(vmid, STATUS_RUNNING)

    def stop(self, vmid: int, timeout_s: float = 5.0) -> None:
        """Status stopped first (no new exec gets in), then SIGKILL every member; the
        container's /tmp (tmux sockets) does not survive a stop."""
        self._set_status(vmid, STATUS_STOPPED)
        deadline = time.monotonic() + timeout_s
        while (pids := self.members(vmid)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        tmp = os.path.join(self.root(vmid), "tmp")
        if os.path.isdir(tmp):
            for name in os.listdir(tmp):
                if name.startswith("tmux-"):
                    shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        cgroup = self._meta(vmid, "cgroup")
        if cgroup:
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)


def reinject(argv: list[str], ours: dict[str, str], bin_dir: str) -> list[str]:
    """``argv`` with the simulated variables laid in after the assignments of a leading
    ``env -i`` (also behind ``timeout ...``); the container's bin dir goes first on its PATH.

    >>> reinject(["timeout", "5", "env", "-i", "PATH=/usr/bin", "HOME=/root", "ls"], {"HOME": "/c/root"}, "/c/usr/bin")
    ['timeout', '5', 'env', '-i', 'PATH=/usr/bin', 'HOME=/root', 'HOME=/c/root', 'PATH=/c/usr/bin:/usr/bin', 'ls']
    >>> reinject(["ls", "env", "-i"], {}, "/b")
    ['ls', 'env', '-i']
    """
    start = 0
    if argv and os.path.basename(argv[0]) == "timeout":
        start = next((i for i, w in enumerate(argv) if os.path.basename(w) == "env"), len(argv))
    if argv[start : start + 2] not in (["env", "-i"], ["/usr/bin/env", "-i"]):
        return argv
    end = start + 2
    assigned: dict[str, str] = {}
    while end < len(argv) and "=" in argv[end] and not argv[end].startswith("="):
        key, _, value = argv[end].partition("=")
        assigned[key] = value
        end += 1
    path = ":".join(p for p in (bin_dir, assigned.get("PATH", "")) if p)
    extra = [f"{k}={v}" for k, v in ours.items()] + [f"PATH={path}"]
    return [*argv[:end], *extra, *argv[end:]]


def join_cgroup(cgroup: str, join: bool = True) -> None:
    """mkdir -p the container's cgroup leaf (and move this process into it when ``join``).

    Retried: another sandbox's ``down`` may rmdir the shared, empty ``lxc/<vmid>/ns``
    or ``lxc/<vmid>`` parent between our mkdirs (FileNotFoundError). Other failures
    (no cgroup v2 rights) are ignored: the ORCH_SANDBOX_CT marker still finds the process.
    """
    for _ in range(5):
        try:
            os.makedirs(cgroup, exist_ok=True)
            if join:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
                    fh.write("0")
            return
        except FileNotFoundError:
            continue
        except OSError:
            return
