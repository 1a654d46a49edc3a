"""pct over real LXC containers, as real pct is over lxc: ``lxc-* -P <state>/lxc -n <vmid>``.

- exec: ``exec lxc-attach -n VMID --keep-env|--clear-env -- ARGV`` (pct.pm). pct is replaced
  by lxc-attach, which forwards no signal to the command without a pty: a killed
  ``pct exec`` leaves the command running in the container (lxc ``attach.c``).
- status: ``lxc-info -sH`` (RUNNING); start: ``lxc-start``; stop: ``lxc-stop --kill``
  (``PVE::LXC::vm_stop`` with kill, what ``pct stop`` does).
- push/pull: a worker enters the container's mount namespace (``/proc/<init>/ns/mnt``),
  as pct.pm does, so paths are the container's own, its mounts included.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

from orchestrator.sandbox.pct.die import Die

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000


class LxcBackend:
    """Containers of the sandbox in ``state`` (lxcpath ``state/lxc``)."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.lxcpath = os.path.join(state, "lxc")

    def _run(self, tool: str, vmid: int, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool, "-P", self.lxcpath, "-n", str(vmid), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )

    def _defined(self, vmid: int) -> bool:
        return os.path.isfile(os.path.join(self.lxcpath, str(vmid), "config"))

    def running(self, vmid: int) -> bool:
        """PVE::LXC::check_running: the container has an init process (``lxc-info -s``)."""
        return (
            self._defined(vmid) and self._run("lxc-info", vmid, "-sH").stdout.strip() == "RUNNING"
        )

    def init_pid(self, vmid: int) -> int:
        text = self._run("lxc-info", vmid, "-pH").stdout.strip()
        if not text.isdigit():
            raise Die(f"container '{vmid}' not running!\n")
        return int(text)

    def exec(self, vmid: int, keep_env: bool, argv: list[str], env: dict[str, str]) -> int:
        cmd = ["lxc-attach", "-P", self.lxcpath, "-n", str(vmid)]
        cmd += ["--keep-env" if keep_env else "--clear-env", "--", *argv]
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvpe(cmd[0], cmd, env)
        except OSError as exc:
            raise Die(f"exec failed: {exc.strerror}\n") from None

    def enter(self, vmid: int, unprivileged: bool = False) -> None:
        """pct.pm push's realcmd: both namespaces opened first (the host's /proc is gone once
        inside), setns into the mount namespace, chdir /; for an unprivileged container then
        its user namespace, setgid(0), setuid(0): what it creates is the container root's."""
        init = self.init_pid(vmid)
        mnt = _open_ns(f"/proc/{init}/ns/mnt", "failed to open the container's mount namespace\n")
        user = None
        try:
            if unprivileged:
                user = _open_ns(
                    f"/proc/{init}/ns/user", "failed to open the container's user namespace\n"
                )
            _setns(mnt, CLONE_NEWNS, "failed to enter the container's mount namespace\n")
            os.chdir("/")
            if user is not None:
                _setns(user, CLONE_NEWUSER, "failed to enter the container's user namespace\n")
                try:
                    os.setgid(0)
                    os.setuid(0)
                except OSError as exc:
                    raise Die(f"setuid failed: {exc.strerror}\n") from None
        finally:
            for fd in (mnt, user):
                if fd is not None:
                    os.close(fd)

    def path(self, vmid: int, path: str) -> str:
        return path

    def start(self, vmid: int) -> None:
        """lxc-start, after emptying the container's /tmp as systemd-tmpfiles does at boot."""
        tmp = os.path.join(self.state, "containers", str(vmid), "rootfs", "tmp")
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(tmp):
                path = os.path.join(tmp, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        # lxc-start's monitor daemonizes: its output goes to a file, not a pipe we would wait on
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.run(
                ["lxc-start", "-P", self.lxcpath, "-n", str(vmid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=60,
            )
            err.seek(0)
            text = err.read()
        if proc.returncode != 0 or not self.running(vmid):
            sys.stderr.write(text)
            raise Die(f"startup for container '{vmid}' failed\n")

    def stop(self, vmid: int) -> None:
        proc = self._run("lxc-stop", vmid, "--kill")
        if proc.returncode != 0 and self.running(vmid):
            raise Die(f"{proc.stderr.strip()}\nstopping container '{vmid}' failed\n")


def _open_ns(path: str, failure: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        raise Die(failure) from None


def _setns(fd: int, kind: int, failure: str) -> None:
    """setns(2) into the namespace open at ``fd``; pct's message ``failure`` when it fails."""
    try:
        setns = getattr(os, "setns", None)  # Python >= 3.12
        if setns is not None:
            setns(fd, kind)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, kind) != 0:
            raise OSError(ctypes.get_errno(), "setns")
    except OSError:
        raise Die(failure) from None
