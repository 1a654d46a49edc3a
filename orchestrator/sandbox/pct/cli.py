"""pct's front end: argument grammar, messages and exit codes, over a container backend.

Sources (read at proxmox/pve-container and proxmox/pve-common): ``src/PVE/CLI/pct.pm``
(exec, push, pull, status, create_file), pve-common ``CLIHandler.pm`` (``run_cli_handler``
forces ``PATH=/sbin:/bin:/usr/sbin:/usr/bin``; options parsed by Getopt::Long) and
``RESTEnvironment.pm`` (``setup_default_cli_env``: "please run as root"; ``fork_worker``:
push/pull run in a worker whose failure is printed on stderr while pct exits 0). A Perl
``die`` prints its message on stderr and exits with ``$!`` when set, else 255: a missing
config is ENOENT, so 2. A message without a trailing newline gets `` at FILE line N.``
docs/sandbox.md has the table of what is copied.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from orchestrator.sandbox.pct.die import Die, die

NODE = "sandbox"
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # pve-common CLIHandler::run_cli_handler
ENOENT_EXIT = 2


USAGE = {
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "list": "pct list",
}


def param_error(cmd: str, detail: str) -> None:
    raise Die(f"400 {detail}\n{USAGE.get(cmd, 'pct <COMMAND> [ARGS] [OPTIONS]')}")


def getopt(
    cmd: str, args: list[str], options: dict[str, bool], npos: int, rest: bool = False
) -> tuple[dict[str, str], list[str]]:
    """Getopt::Long-like: options (``-o``/``--o``, ``=v`` or next arg) anywhere before ``--``.

    ``options`` maps a name to whether it takes a value. Returns (opts, positionals).
    With ``rest`` the positionals after the first ``npos`` are the extra args.

    >>> getopt("exec", ["200", "--keep-env", "0", "--", "ls", "-la"], {"keep-env": True}, 1, True)
    ({'keep-env': '0'}, ['200', 'ls', '-la'])
    """
    opts: dict[str, str] = {}
    pos: list[str] = []
    bad: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            pos.extend(args[i + 1 :])
            break
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.lstrip("-").partition("=")
            if name not in options:
                bad.append(name)
            elif options[name] and not eq:
                if i + 1 >= len(args):
                    sys.stderr.write(f"Option {name} requires an argument\n")
                    param_error(cmd, "unable to parse option")
                i += 1
                opts[name] = args[i]
            else:
                opts[name] = value if eq else "1"
            i += 1
            continue
        pos.append(arg)
        i += 1
    if bad:
        for name in bad:
            sys.stderr.write(f"Unknown option: {name}\n")
        param_error(cmd, "unable to parse option")
    if len(pos) < npos:
        param_error(cmd, "not enough arguments")
    if not rest and len(pos) > npos:
        param_error(cmd, "too many arguments")
    return opts, pos


def check_vmid(cmd: str, raw: str) -> int:
    if not raw.isdigit():
        param_error(
            cmd,
            f"Parameter verification failed.\nvmid: type check ('integer') failed - got '{raw}'",
        )
    vmid = int(raw)
    if not 100 <= vmid <= 999999999:
        param_error(
            cmd, "Parameter verification failed.\nvmid: value must have a minimum value of 100"
        )
    return vmid


def parse_perms(perms: str | None) -> int | None:
    """``--perms``: octal unless ``0x`` (pct prefixes a ``0`` first); raises Die "invalid mode".

    >>> parse_perms("755"), parse_perms("0x1ed"), parse_perms(None)
    (493, 493, None)
    """
    if perms is None:
        return None
    try:
        return int(perms, 16) if perms.lower().startswith("0x") else int(perms, 8)
    except ValueError:
        raise Die(f"invalid mode: '{perms}'\n") from None


def _lookup(name: str | None, kind: str, table: Callable[[str], int]) -> int:
    if name is None:
        return -1
    if name.isdigit():
        return int(name)
    try:
        return table(name)
    except KeyError:
        raise Die(f"failed to get {kind} for: {name}\n") from None


def owner(user: str | None, group: str | None) -> tuple[int, int]:
    """(uid, gid) of ``--user``/``--group`` (names or numbers; -1 when not given)."""
    return (
        _lookup(user, "uid", lambda n: pwd.getpwnam(n).pw_uid),
        _lookup(group, "gid", lambda n: grp.getgrnam(n).gr_gid),
    )


def create_file(
    path: str, perms: str | None, user: str | None, group: str | None, shown: str | None = None
) -> int:
    """pct.pm create_file: owner and mode parsed here; new files get 0666 & ~umask unless
    ``perms``; the parent must exist. Returns an fd open for writing. Messages name ``shown``
    (the path as the caller gave it; process mode opens it elsewhere)."""
    shown = shown or path
    uid, gid = owner(user, group)
    mode = parse_perms(perms)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    except FileExistsError:
        fd = -1
    except OSError as exc:
        raise Die(f"failed to create file: {shown}: {exc.strerror}\n") from None
    if fd < 0:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            raise Die(f"failed to create file: {shown}: {exc.strerror}\n") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid != -1 or gid != -1:
        try:
            os.fchown(fd, uid, gid)
        except OSError as exc:
            raise Die(f"failed to change file owner: {exc.strerror}\n") from None
    return fd


def copy_fd(src_fd: int, dst_fd: int) -> None:
    with os.fdopen(src_fd, "rb") as src, os.fdopen(dst_fd, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def worker(task: Callable[[], None]) -> int:
    """RESTEnvironment::fork_worker as the CLI runs it: ``task`` in a child; its ``die`` is
    printed on stderr as one line; pct itself exits 0 either way (push/pull check no status)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            task()
        except Die as exc:
            sys.stderr.write(" ".join(str(exc).strip().splitlines()) + "\n")
            status = 255
        except BaseException as exc:  # noqa: BLE001 - a worker never raises into pct
            sys.stderr.write(f"{exc}\n")
            status = 255
        sys.stderr.flush()
        os._exit(status)
    os.waitpid(pid, 0)
    return 0


class Backend(Protocol):
    """Where the containers are: real LXC (lxcmode) or process-mode directories (procmode)."""

    def running(self, vmid: int) -> bool: ...

    def exec(self, vmid: int, keep_env: bool, argv: list[str], env: dict[str, str]) -> int: ...

    def enter(self, vmid: int, unprivileged: bool = False) -> None:
        """In a worker: make container paths mean the container's files (setns, chdir /);
        ``unprivileged``: its user namespace too, as uid/gid 0 there (pct.pm push/pull)."""

    def path(self, vmid: int, path: str) -> str:
        """A container path as this process (after :meth:`enter`) opens it."""

    def start(self, vmid: int) -> None: ...

    def stop(self, vmid: int) -> None: ...


class Pct:
    """The sub-commands over one state directory and backend, as Proxmox node ``node``
    (``$ORCH_SANDBOX_NODE``): its containers are the configs in ``etc/pve/nodes/<node>/lxc``
    (a sandbox from before several hosts keeps the first node's in ``etc/pve/lxc``)."""

    def __init__(self, state: str, backend: Backend, node: str = NODE) -> None:
        self.state, self.backend, self.node = state, backend, node

    def conf_dir(self) -> str:
        path = os.path.join(self.state, "etc", "pve", "nodes", self.node, "lxc")
        old = os.path.join(self.state, "etc", "pve", "lxc")
        if self.node == NODE and not os.path.isdir(path) and os.path.isdir(old):
            return old
        return path

    def load_config(self, vmid: int) -> dict[str, str]:
        path = os.path.join(self.conf_dir(), f"{vmid}.conf")
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise Die(
                f"Configuration file 'nodes/{self.node}/lxc/{vmid}.conf' does not exist\n",
                ENOENT_EXIT,
            ) from None
        conf: dict[str, str] = {}
        for line in text.splitlines():
            if line.strip() and not line.startswith("#") and ":" in line:
                key, _, value = line.partition(":")
                conf[key.strip()] = value.strip()
        return conf

    @contextlib.contextmanager
    def config_lock(self, vmid: int, timeout_s: float = 10.0) -> Iterator[None]:
        """Serialize like PVE::LXC::Config->lock_config (flock on a per-vmid lock file)."""
        lock_dir = os.path.join(self.state, "run", "lock", "lxc")
        os.makedirs(lock_dir, exist_ok=True)
        with open(os.path.join(lock_dir, f"pve-config-{vmid}.lock"), "a") as fh:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise Die(
                            f"can't lock file '/run/lock/lxc/pve-config-{vmid}.lock' - got timeout\n"
                        ) from None
                    time.sleep(0.02)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def cmd_exec(self, args: list[str]) -> int:
        opts, pos = getopt("exec", args, {"keep-env": True}, 1, rest=True)
        vmid = check_vmid("exec", pos[0])
        self.load_config(vmid)
        if not self.backend.running(vmid):
            die(f"container '{vmid}' not running!\n")
        if not pos[1:]:
            die("missing command", 263)
        keep_env = opts.get("keep-env", "1") not in ("0", "false", "no")
        # clean_environment() drops SSL_CERT_*; run_cli_handler has already forced PATH
        env = {k: v for k, v in os.environ.items() if not k.startswith("SSL_CERT_")}
        env["PATH"] = CLI_PATH
        return self.backend.exec(vmid, keep_env, pos[1:], env)

    @staticmethod
    def copy_args(cmd: str, args: list[str]) -> tuple[dict[str, str], list[str], int, str | None]:
        """push/pull's (opts, positionals, vmid, perms); pct prefixes ``--perms`` with a ``0``."""
        opts, pos = getopt(cmd, args, {"perms": True, "user": True, "group": True}, 3)
        perms = opts.get("perms")
        perms = perms if perms is None or perms.startswith("0") else "0" + perms
        return opts, pos, check_vmid(cmd, pos[0]), perms

    def cmd_push(self, args: list[str]) -> int:
        opts, pos, vmid, perms = self.copy_args("push", args)
        with self.config_lock(vmid):
            if not self.backend.running(vmid):
                die("can only push files to a running CT\n")
            unprivileged = self.load_config(vmid).get("unprivileged") == "1"

            def task() -> None:
                try:
                    src = os.open(pos[1], os.O_RDONLY)
                except OSError:
                    raise Die(f"failed to open {pos[1]} for reading\n") from None
                self.backend.enter(vmid, unprivileged)
                dst = self.backend.path(vmid, pos[2])
                fd = create_file(dst, perms, opts.get("user"), opts.get("group"), pos[2])
                copy_fd(src, fd)

            return worker(task)

    def cmd_pull(self, args: list[str]) -> int:
        opts, pos, vmid, perms = self.copy_args("pull", args)
        with self.config_lock(vmid):
            if not self.backend.running(vmid):
                die("can only pull files from a running VM", 457)

            def task() -> None:
                dst = create_file(pos[2], perms, opts.get("user"), opts.get("group"))
                self.backend.enter(vmid)
                try:
                    src = os.open(self.backend.path(vmid, pos[1]), os.O_RDONLY)
                except OSError as exc:
                    os.close(dst)
                    raise Die(f"failed to open {pos[1]}: {exc.strerror}\n") from None
                copy_fd(src, dst)

            return worker(task)

    def cmd_status(self, args: list[str]) -> int:
        opts, pos = getopt("status", args, {"verbose": False}, 1)
        vmid = check_vmid("status", pos[0])
        conf = self.load_config(vmid)
        status = "running" if self.backend.running(vmid) else "stopped"
        if opts.get("verbose") not in (None, "0"):
            stat = {
                "name": conf.get("hostname", f"CT{vmid}"),
                "status": status,
                "type": "lxc",
                "vmid": str(vmid),
                "cpus": conf.get("cores", "1"),
                "maxmem": str(int(conf.get("memory", "512")) << 20),
            }
            if conf.get("lock"):  # pve-container src/PVE/LXC.pm vmstatus
                stat["lock"] = conf["lock"]
            init_pid = getattr(self.backend, "init_pid", None)
            if status == "running" and init_pid is not None:  # vmstatus: find_lxc_pid
                stat["pid"] = str(init_pid(vmid))
            for key in sorted(stat):
                print(f"{key}: {stat[key]}")
        else:
            print(f"status: {status}")
        return 0

    def cmd_list(self, args: list[str]) -> int:
        getopt("list", args, {}, 0)
        conf_dir = self.conf_dir()
        names = os.listdir(conf_dir) if os.path.isdir(conf_dir) else []
        vmids = sorted(int(n[:-5]) for n in names if n.endswith(".conf") and n[:-5].isdigit())
        if not vmids:
            return 0
        fmt = "{:<10} {:<10} {:<12} {:<20}"
        print(fmt.format("VMID", "Status", "Lock", "Name"))
        for vmid in vmids:
            conf = self.load_config(vmid)
            status = "running" if self.backend.running(vmid) else "stopped"
            print(fmt.format(vmid, status, conf.get("lock", ""), conf.get("hostname", "")))
        return 0

    def cmd_config(self, args: list[str]) -> int:
        _opts, pos = getopt("config", args, {"current": False}, 1)
        conf = self.load_config(check_vmid("config", pos[0]))
        for key in sorted(conf):
            print(f"{key}: {conf[key]}")
        return 0

    def cmd_start(self, args: list[str]) -> int:
        _opts, pos = getopt("start", args, {}, 1)
        vmid = check_vmid("start", pos[0])
        self.load_config(vmid)
        with self.config_lock(vmid):
            if self.backend.running(vmid):
                die(f"CT {vmid} already running\n")
            self.backend.start(vmid)
        return 0

    def cmd_stop(self, args: list[str]) -> int:
        _opts, pos = getopt("stop", args, {"skiplock": False, "overrule-shutdown": False}, 1)
        vmid = check_vmid("stop", pos[0])
        self.load_config(vmid)
        with self.config_lock(vmid):
            if not self.backend.running(vmid):
                die(f"CT {vmid} not running\n")
            self.backend.stop(vmid)
        return 0


COMMANDS = ("exec", "push", "pull", "status", "list", "config", "start", "stop")


def state_dir() -> str:
    state = os.environ.get("ORCH_SANDBOX_STATE")
    if not state or not os.path.isdir(state):
        raise Die(
            "pct (orch sandbox stand-in): $ORCH_SANDBOX_STATE is not set or not a directory; "
            "run pct through the sandbox sshd"
        )
    return state


def isolation(state: str) -> str:
    """``lxc`` or ``process``: ``$ORCH_SANDBOX_ISOLATION``, else the sandbox's state.json."""
    value = os.environ.get("ORCH_SANDBOX_ISOLATION")
    if value in ("lxc", "process"):
        return value
    import json

    try:
        with open(os.path.join(state, "state.json"), encoding="utf-8") as fh:
            found = json.load(fh).get("isolation")
    except (OSError, ValueError, AttributeError):
        return "process"
    return found if found in ("lxc", "process") else "process"


def backend_for(state: str, mode: str) -> Backend:
    if mode == "lxc":
        from orchestrator.sandbox.pct.lxcmode import LxcBackend

        return LxcBackend(state)
    from orchestrator.sandbox.pct.procmode import ProcessBackend

    return ProcessBackend(state)


PCT_CPU_FILE = "pct_cpu_s"
"""A file in the sandbox's state directory: CPU seconds every pct call spends first."""
MAX_PCT_CPU_S = 5.0


def startup_cpu_s(state: str | None) -> float:
    """CPU seconds this call spends before it parses anything: ``$ORCH_SANDBOX_PCT_CPU_S``,
    else the state directory's ``pct_cpu_s`` file, else 0 (at most :data:`MAX_PCT_CPU_S`).

    A real pct is ``#!/usr/bin/perl -T`` loading ``PVE::CLI::pct`` and with it PVE::LXC,
    PVE::Cluster, PVE::Storage and the API2 schema (pve-container ``src/pct``,
    ``src/PVE/CLI/pct.pm``): every call, ``pct list`` or ``pct status``, pays that start-up
    in CPU before it answers, ~0.3 s on a Proxmox host (the figure ``bench/fleet.py``
    defaults to). The stand-in answers in a few ms of Python, so a benchmark that should
    cost what a real host costs sets this.

    >>> startup_cpu_s(None) >= 0.0
    True
    """
    raw = os.environ.get("ORCH_SANDBOX_PCT_CPU_S")
    if raw is None and state:
        try:
            with open(os.path.join(state, PCT_CPU_FILE), encoding="ascii") as fh:
                raw = fh.read().strip()
        except OSError:
            raw = None
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    return min(max(value, 0.0), MAX_PCT_CPU_S)


def spend_cpu(seconds: float) -> None:
    """Burn ``seconds`` of this process's CPU (user time, as an interpreter's start-up is)."""
    if seconds <= 0:
        return
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(2000):
            x ^= i * 2654435761


def main(argv: list[str]) -> int:
    spend_cpu(startup_cpu_s(os.environ.get("ORCH_SANDBOX_STATE")))
    if not argv or argv[0] not in COMMANDS:
        if argv and argv[0] in ("help", "-h", "--help"):
            print(
                "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n\n"
                + "\n".join("       " + USAGE[c] for c in COMMANDS)
            )
            return 0
        sys.stderr.write(
            f"ERROR: unknown command 'pct {argv[0] if argv else ''}'\n"
            "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n"
        )
        return 255
    try:
        mode = os.environ.get("ORCH_SANDBOX_ISOLATION", "")
        if mode == "lxc" and os.geteuid() != 0:  # setup_default_cli_env, before any parsing
            raise Die("please run as root\n")
        state = state_dir()
        mode = isolation(state)
        if mode == "lxc" and os.geteuid() != 0:
            raise Die("please run as root\n")
        pct = Pct(state, backend_for(state, mode), os.environ.get("ORCH_SANDBOX_NODE") or NODE)
        handler: Callable[[list[str]], int] = getattr(pct, "cmd_" + argv[0])
        return handler(argv[1:])
    except Die as exc:
        msg = str(exc)
        sys.stderr.write(msg if msg.endswith("\n") else msg + "\n")
        return exc.status
