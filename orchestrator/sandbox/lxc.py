"""LXC mode: each sandbox container is a real LXC container (LXC 5, as root), named by its vmid.

Per container ``<vmid>`` of state directory ``D``::

    D/lxc/<vmid>/config            the LXC config (lxcpath ``D/lxc``: ``lxc-* -P D/lxc -n <vmid>``)
    D/containers/<vmid>/rootfs/    its "/": private /root (HOME, the workdir /root/dflash),
                                   /tmp, /var, /etc; bin, lib, lib64, sbin link into /usr
    D/containers/<vmid>/usr/       the upper layer of its /usr: an overlay whose read-only
                                   lower layer is the host's /usr; holds the GPU driver's
                                   user space (nvidia-smi, libnvidia-ml.so.1), /sbin/init,
                                   and whatever the container installs (pip into /usr/local)

Made in well under a second, nothing downloaded. No network (``lxc.net.0.type =
empty``). The operator's Python (``sys.prefix``, its base install and any other
site-packages on ``sys.path``, e.g. torch's) is bind-mounted read-only at the same
path, and the sandbox's hosts.yaml names it as the container's ``python``.
``D/driver/`` (the GPU scenario) is bind-mounted read-only at ``/dev/orch-nvidia``,
where the fake libnvidia-ml reads it, as a real container gets ``/dev/nvidia*``.

Cgroups follow Proxmox's layout (pve-container ``LXC.pm``: ``lxc.cgroup.dir.container =
lxc/<vmid>``, ``.monitor = lxc.monitor/<vmid>``, ``.container.inner = ns``) below a
per-sandbox prefix ``orch-<id>``, so two sandboxes' CT 200 never collide: a process
in CT 200 shows ``/orch-<id>/lxc/200/ns/...`` in the host's ``/proc/PID/cgroup``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.sandbox import unpriv
from orchestrator.sandbox.files import STANDIN_DIR, rmdir_cgroup, sh_wrapper, write_atomic
from orchestrator.sandbox.state import SandboxError

log = logging.getLogger(__name__)

TOOLS = ("lxc-start", "lxc-attach", "lxc-info", "lxc-ls", "lxc-stop")
MOUNTED = ("usr", "run", "dev", "proc", "sys")  # what a container mounts over its root fs
DRIVER_MOUNT = "dev/orch-nvidia"
# what a real container needs of /etc (copied; never keys, shadow or sudoers)
ETC_FILES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "localtime",
    "timezone",
    "shells",
    "profile",
    "bash.bashrc",
    "environment",
    "inputrc",
    "host.conf",
    "debian_version",
    "os-release",
    "mime.types",
    "gai.conf",
)
ETC_DIRS = ("ld.so.conf.d", "alternatives", "terminfo", "profile.d")
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
REFUSING_DMESG = (
    "#!/bin/sh\n"
    "# orch sandbox: an unprivileged LXC container may not read the host's kernel ring buffer\n"
    "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
    "exit 1\n"
)


def unavailable() -> str | None:
    """Why LXC mode cannot run on this machine (one short phrase), or None when it can."""
    if os.geteuid() != 0:
        return "not running as root"
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return f"{missing[0]} is not installed (apt-get install -y lxc)"
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlay file system"
    except OSError:
        return "/proc/filesystems is unreadable"
    if not cgroup_mounts():
        return "no cgroup file system is mounted"
    return None


def lxcpath(state_dir: Path) -> Path:
    """The sandbox's own lxcpath (``lxc-* -P``)."""
    return state_dir / "lxc"


def container_dir(state_dir: Path, vmid: int) -> Path:
    return state_dir / "containers" / str(vmid)


def rootfs(state_dir: Path, vmid: int) -> Path:
    """The host directory that is the container's ``/`` (mounts inside it are not seen here)."""
    return container_dir(state_dir, vmid) / "rootfs"


def cgroup_prefix(state_dir: Path) -> str:
    """``orch-<id>``: this sandbox's cgroup directory in every hierarchy (id from its path)."""
    return "orch-" + hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]


def multiarch_libdir() -> str:
    """Where the host's libc lives below /usr (``lib/x86_64-linux-gnu``; ``lib`` if not multiarch).

    A library there is found by the dynamic loader's default search, no ld.so.cache entry needed.
    """
    for libc in sorted(Path("/usr/lib").glob("*-linux-gnu*/libc.so.6")):
        return f"lib/{libc.parent.name}"
    return "lib"


def python_mounts() -> list[Path]:
    """Directories of the operator's Python to bind-mount read-only at the same path.

    ``sys.prefix`` (a venv), ``sys.base_prefix`` (its interpreter, e.g. under pyenv)
    and every site-packages on ``sys.path`` outside them (a ``.pth`` may add another
    venv's, where torch lives); nothing under /usr (the container has it) and no
    source checkout (orch reaches a container only through its bundles).
    """
    candidates = [Path(sys.prefix), Path(sys.base_prefix)] + [
        Path(p) for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages")
    ]
    chosen: list[Path] = []
    for path in sorted({c.absolute() for c in candidates}, key=lambda p: len(p.parts)):
        if not path.is_dir() or path == Path("/") or path.is_relative_to("/usr"):
            continue
        if any(path.is_relative_to(c) for c in chosen):
            continue
        chosen.append(path)
    return chosen


def lxc_config(
    state_dir: Path,
    vmid: int,
    binds: Iterable[Path],
    root_dirs: Iterable[str] = (),
    net: Iterable[str] = (),
    hook: Path | None = None,
) -> str:
    """The LXC config of container ``vmid`` (pure).

    >>> text = lxc_config(Path("/s"), 200, [Path("/opt/venv")])
    >>> [line for line in text.splitlines() if "cgroup.dir" in line]
    ['lxc.cgroup.dir.container = orch-f9b05e8809/lxc/200', 'lxc.cgroup.dir.monitor = orch-f9b05e8809/lxc.monitor/200', 'lxc.cgroup.dir.container.inner = ns']
    >>> "lxc.mount.entry = /opt/venv opt/venv none bind,ro,create=dir 0 0" in text
    True

    ``net``: the job network's hook lines (network.py); the LXC network stays ``empty``
    (loopback only) and the hook adds ``eth0``. ``hook`` (unprivileged.py's mount hook):
    an unprivileged container, root mapped to 100000, its mounts staged by that hook.

    >>> text = lxc_config(Path("/s"), 200, [Path("/opt/venv")], hook=Path("/s/lib/lxc-unpriv"))
    >>> [line for line in text.splitlines() if "idmap" in line or "rootfs.path" in line]
    ['lxc.rootfs.path = dir:/run/orch-sandbox/orch-f9b05e8809/200/rootfs', 'lxc.idmap = u 0 100000 65536', 'lxc.idmap = g 0 100000 65536']
    """
    for path in (state_dir, *binds):
        if any(c.isspace() for c in str(path)) or "," in str(path):
            raise SandboxError(
                f"LXC mode cannot mount {path}: a path with blanks or commas; "
                f"use another --dir, or --isolation process"
            )
    ct = container_dir(state_dir, vmid)
    prefix = cgroup_prefix(state_dir)
    binds = list(binds)
    usr = (
        f"lxc.mount.entry = overlay usr overlay lowerdir=/usr,upperdir={ct / 'usr'},"
        f"workdir={ct / '.usr-work'} 0 0"
    )
    src = {"rootfs": str(ct / "rootfs"), "driver": str(state_dir / "driver")}
    src |= {str(p): str(p) for p in binds}
    mapped: list[str] = []
    if hook is not None:
        stage = unpriv.staging_dir(prefix, vmid)
        hooks, src = unpriv.hook_lines(
            hook, stage, ct / "rootfs", (ct / "usr", ct / ".usr-work"), state_dir / "driver", binds
        )
        usr = f"lxc.mount.entry = {src['usr']} usr none bind 0 0"
        mapped = [*unpriv.ID_MAP_LINES, *hooks]
    lines = [
        f"# orch sandbox container {vmid} (written by orch sandbox up; Proxmox keeps its own",
        "# at /var/lib/lxc/<vmid>/config, generated from /etc/pve/lxc/<vmid>.conf)",
        f"lxc.uts.name = ct{vmid}",
        f"lxc.rootfs.path = dir:{src['rootfs']}",
        *mapped,
        "lxc.init.cmd = /sbin/init",
        "lxc.net.0.type = empty",
        *net,
        "lxc.pty.max = 1024",
        "lxc.tty.max = 0",
        "lxc.console.path = none",
        "lxc.autodev = 1",
        "lxc.apparmor.profile = unconfined",
        "lxc.cap.drop = sys_module mac_admin mac_override sys_time sys_rawio",
        "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
        usr,
        *(f"lxc.mount.entry = /{d} {d} none bind,ro 0 0" for d in root_dirs),
        "lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755,create=dir 0 0",
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
        f"lxc.mount.entry = {src['driver']} {DRIVER_MOUNT} none bind,ro,create=dir 0 0",
        *(
            f"lxc.mount.entry = {src[str(p)]} {str(p).lstrip('/')} none bind,ro,create=dir 0 0"
            for p in binds
        ),
        f"lxc.cgroup.dir.container = {prefix}/lxc/{vmid}",
        f"lxc.cgroup.dir.monitor = {prefix}/lxc.monitor/{vmid}",
        "lxc.cgroup.dir.container.inner = ns",
        f"lxc.log.file = {lxcpath(state_dir) / str(vmid) / 'lxc.log'}",
        "lxc.log.level = WARN",
    ]
    return "\n".join(lines) + "\n"


def _copy_etc(etc: Path, vmid: int, address: str | None = None) -> None:
    for name in ETC_FILES:
        src = Path("/etc") / name
        if src.is_symlink() or src.is_file():
            (etc / name).unlink(missing_ok=True)
            shutil.copy2(src, etc / name, follow_symlinks=False)
    for name in ETC_DIRS:
        src = Path("/etc") / name
        if src.is_dir() and not (etc / name).exists():
            shutil.copytree(src, etc / name, symlinks=True, ignore_dangling_symlinks=True)
    for pydir in Path("/etc").glob("python3*"):
        if pydir.is_dir() and not (etc / pydir.name).exists():
            shutil.copytree(pydir, etc / pydir.name, symlinks=True)
    write_atomic(etc / "hostname", f"ct{vmid}\n")
    # as Proxmox writes a container's /etc/hosts for a static address: the hostname resolves to
    # it (gloo and torchrun's c10d find their own address this way)
    mine = f"{address}\tct{vmid}" if address else f"127.0.1.1\tct{vmid}"
    write_atomic(etc / "hosts", f"127.0.0.1\tlocalhost\n{mine}\n::1\tlocalhost ip6-localhost\n")
    write_atomic(etc / "resolv.conf", "# no DNS in an orch sandbox container\n")
    with contextlib.suppress(FileExistsError):
        (etc / "mtab").symlink_to("../proc/self/mounts")


def _make_rootfs(root: Path, vmid: int, address: str | None = None) -> list[str]:
    """The skeleton of a container's ``/``; returns the top-level dirs to bind-mount read-only
    (``bin``, ``lib``... where the host's ``/usr`` is not merged)."""
    for sub, mode in (("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub).chmod(mode)
    for sub in ("dev", "proc", "sys", "run", "usr", "etc", "home", "mnt", "opt", "srv", "media"):
        (root / sub).mkdir(exist_ok=True)
    for sub in ("var/log", "var/lib", "var/cache", "var/spool", "root/dflash"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (root / "var" / "run").symlink_to("../run")
    binds = []
    for name in ROOT_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            with contextlib.suppress(FileExistsError):
                (root / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (root / name).mkdir(exist_ok=True)
            binds.append(name)
    _copy_etc(root / "etc", vmid, address)
    return binds


def _fill_usr(upper: Path, lib_dir: Path) -> None:
    """The container-private part of /usr: the GPU driver's user space and /sbin/init."""
    libdir = upper / multiarch_libdir()
    for sub in (upper / "bin", upper / "sbin", upper / "lib" / "orch-sandbox", libdir):
        sub.mkdir(parents=True, exist_ok=True)
    for src, dst in (
        (lib_dir / "libnvidia-ml.so.1", libdir / "libnvidia-ml.so.1"),
        (lib_dir / "init", upper / "sbin" / "init"),
        (STANDIN_DIR / "nvidia-smi", upper / "lib" / "orch-sandbox" / "nvidia-smi"),
    ):
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    sh_wrapper(
        upper / "bin" / "nvidia-smi",
        [sys.executable, "-E", "-S", "/usr/lib/orch-sandbox/nvidia-smi"],
    )
    write_atomic(upper / "bin" / "dmesg", REFUSING_DMESG, 0o755)


def make_container(
    state_dir: Path,
    vmid: int,
    lib_dir: Path,
    *,
    net: Iterable[str] = (),
    address: str | None = None,
    unprivileged: bool = False,
) -> Path:
    """Create (or refresh, while stopped) LXC container ``vmid``; returns its root file system.

    ``lib_dir`` holds the built ``libnvidia-ml.so.1`` and ``init``; ``net`` the job network's
    config lines and ``address`` the container's address on it. ``unprivileged``: root inside
    is uid 100000 outside (unpriv.py); its root file system and ``/usr`` layer are owned by
    100000 and up. Nothing is started.

    Raises:
        SandboxError: a path LXC cannot mount (blanks or commas in it); unprivileged, a
            directory above ``state_dir`` that uid 100000 may not enter.
    """
    ct = container_dir(state_dir, vmid)
    root = ct / "rootfs"
    (ct / ".usr-work").mkdir(parents=True, exist_ok=True)
    root_dirs = _make_rootfs(root, vmid, address)
    _fill_usr(ct / "usr", lib_dir)
    hook = None
    if unprivileged:
        hook = lib_dir / unpriv.HOOK_NAME
        write_atomic(hook, unpriv.HOOK, 0o755)
        for sub in ("local/bin", "local/lib", "local/share"):  # the container's own /usr/local
            (ct / "usr" / sub).mkdir(parents=True, exist_ok=True)
        unpriv.chown_tree(root)
        unpriv.chown_tree(ct / "usr")
    config = lxcpath(state_dir) / str(vmid) / "config"
    config.parent.mkdir(parents=True, exist_ok=True)
    text = lxc_config(state_dir, vmid, python_mounts(), root_dirs, net, hook)
    if unprivileged and (shut := unpriv.untraversable(state_dir.parent)) is not None:
        raise SandboxError(
            f"unprivileged containers: uid {unpriv.ROOT_ID} may not enter {shut} (no x for "
            f"others); use a --dir below a directory others may traverse, or chmod o+x {shut}"
        )
    write_atomic(config, text)
    return root


def root_uid(state_dir: Path, vmid: int) -> int:
    """The host uid of container ``vmid``'s root (0, or 100000 when unprivileged)."""
    try:
        return unpriv.mapped_root((lxcpath(state_dir) / str(vmid) / "config").read_text())
    except OSError:
        return 0


def _lxc(state_dir: Path, tool: str, vmid: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool, "-P", str(lxcpath(state_dir)), "-n", str(vmid), *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def init_pid(state_dir: Path, vmid: int) -> int | None:
    """The host PID of the container's init (``lxc-info -pH``), or None when it is not running."""
    if not (lxcpath(state_dir) / str(vmid) / "config").exists():
        return None
    text = _lxc(state_dir, "lxc-info", vmid, "-pH").stdout.strip()
    return int(text) if text.isdigit() else None


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def namespace_pids(init: int) -> list[int]:
    """Host PIDs of every process in the PID namespace whose init is host PID ``init``."""
    want = _pid_ns(init)
    if want is None:
        return []
    return sorted(
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _pid_ns(int(p.name)) == want
    )


def _ns_ids(host_pid: int, field: str) -> list[int]:
    """``NSpid``/``NSpgid`` of a process: its id in each PID namespace, host's first."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def ns_pid_of(host_pid: int) -> int | None:
    """The PID that host PID ``host_pid`` has in its own (innermost) PID namespace (``NSpid``)."""
    ids = _ns_ids(host_pid, "NSpid")
    return ids[-1] if ids else None


def host_pid(state_dir: Path, vmid: int, ns_pid: int, *, group: bool = False) -> int | None:
    """The host PID of the process that container ``vmid`` knows as ``ns_pid`` (with ``group``:
    the host id of the process group it knows as ``ns_pid``, from ``NSpgid``); None: none."""
    init = init_pid(state_dir, vmid)
    if init is None:
        return None
    for pid in namespace_pids(init):
        ids = _ns_ids(pid, "NSpgid" if group else "NSpid")
        if ids and ids[-1] == ns_pid:
            return ids[0]
    return None


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and v2)."""
    found = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] in ("cgroup", "cgroup2"):
                found.append(Path(left.split()[4]))
    except OSError:
        pass
    return found


def remove_cgroups(state_dir: Path, timeout_s: float = 5.0) -> list[str]:
    """rmdir this sandbox's ``orch-<id>`` tree in every hierarchy, deepest first.

    LXC removes a stopped container's own cgroups but leaves the parents it made
    (``orch-<id>/lxc``, ``orch-<id>/lxc.monitor``). A process still in the tree is
    this sandbox's by construction: it is SIGKILLed and the rmdir retried until
    ``timeout_s``. Returns the directories that could not be removed.
    """
    prefix = cgroup_prefix(state_dir)
    deadline = time.monotonic() + timeout_s
    left: list[str] = []
    for mount in cgroup_mounts():
        top = mount / prefix
        if not top.is_dir():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: -len(p.parts))
        left += [str(path) for path in dirs if not rmdir_cgroup(path, deadline)]
    return left


def defined(state_dir: Path) -> list[int]:
    """vmids that have an LXC config in the sandbox's lxcpath (what ``lxc-ls -P`` lists)."""
    path = lxcpath(state_dir)
    if not path.is_dir():
        return []
    return sorted(
        int(p.name) for p in path.iterdir() if p.name.isdigit() and (p / "config").exists()
    )


def undefine(state_dir: Path) -> None:
    """Remove the sandbox's lxcpath (configs and LXC logs) once its containers are stopped,
    so ``lxc-ls -P D/lxc`` lists nothing; the root file systems (run logs) stay."""
    shutil.rmtree(lxcpath(state_dir), ignore_errors=True)
