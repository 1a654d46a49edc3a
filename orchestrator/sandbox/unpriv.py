"""Unprivileged sandbox containers: root inside is uid 100000 outside, as on Proxmox.

pve-container ``src/PVE/LXC.pm`` ``parse_id_maps``: a container with ``unprivileged: 1`` and
no ``lxc.idmap`` of its own gets ``['u', '0', '100000', '65536'], ['g', '0', '100000',
'65536']`` and ``$rootuid = $rootgid = 100000``; ``update_lxc_config`` writes them as
``lxc.idmap = u 0 100000 65536`` / ``lxc.idmap = g 0 100000 65536``. Its root file system
is owned by 100000 and up.

LXC sets an unprivileged container's mounts up as its mapped root, so two things of the
privileged layout cannot be done there, and are done on the host instead, by a
``pre-start`` hook (as root, in the host's mount namespace), in a staging directory
``/run/orch-sandbox/<orch-id>/<vmid>/``; the next ``pre-start`` replaces them and ``orch
sandbox down`` unmounts them. (Not ``post-stop``: LXC runs it after ``lxc-stop`` returned, so a
``pct stop`` + ``pct start`` raced it, and it unmounted the new start's root file system.)

- every mount source must be reachable by uid 100000, and a state directory below a
  private one (``/root``, pytest's ``/tmp/pytest-of-root``, mode 0700) is not: the root
  file system, the GPU scenario and the operator's Python are bind-mounted into the
  staging directory first;
- an overlay mounted inside the user namespace refuses every ``execve`` from it
  (``Operation not permitted - Failed to exec "/sbin/init"``, LXC 5.0.2, kernel 6.18): the
  ``/usr`` overlay is mounted by the hook and bind-mounted in.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT_ID = 100000
"""Container root's uid and gid on the host."""
ID_COUNT = 65536
ID_MAP_LINES = (f"lxc.idmap = u 0 {ROOT_ID} {ID_COUNT}", f"lxc.idmap = g 0 {ROOT_ID} {ID_COUNT}")
STAGING = Path("/run/orch-sandbox")
HOOK_NAME = "lxc-unpriv"

# The hook: argv = staging dir, then "overlay LOWER UPPER WORK TARGET" and "bind SRC TARGET"
# records (TARGET below the staging dir), then "--". LXC runs it as `hook ARGS NAME lxc TYPE`.
HOOK = r"""#!/bin/sh
# orch sandbox: mounts of an unprivileged container, made on the host before it starts
# (lxc.hook.pre-start); the mounts of its previous start are removed first.
set -eu
stage=$1; shift
eval "type=\${$#}"  # LXC appends NAME lxc TYPE
clear() {  # every mount below the staging dir, stacked ones too, deepest first
  for _ in 1 2 3 4 5 6 7 8; do
    mounts=$(awk -v s="$stage/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    [ -n "$mounts" ] || return 0
    for m in $mounts; do umount -l "$m" 2>/dev/null || true; done
  done
}
clear
[ "$type" = pre-start ] || exit 0
mkdir -p "$stage"; chmod 0711 "$stage"
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  kind=$1
  if [ "$kind" = overlay ]; then
    mkdir -p "$5"
    mount -t overlay overlay -o "lowerdir=$2,upperdir=$3,workdir=$4" "$5"; shift 5
  else
    target=$3
    mkdir -p "$target"
    mount --bind "$2" "$target"; shift 3
    if [ "$kind" = bind-ro ]; then mount -o remount,bind,ro "$target"; fi
  fi
done
"""


def untraversable(path: Path) -> Path | None:
    """The first directory above ``path`` (or itself) that others may not enter (no ``o+x``):
    LXC refuses an unprivileged container there ("Could not access DIR. Please grant it x
    access, or add an ACL for the container root", LXC 5.0.2 start.c)."""
    for parent in [*reversed(path.absolute().parents), path.absolute()]:
        with contextlib.suppress(OSError):
            if not parent.stat().st_mode & 0o001:
                return parent
    return None


def staging_dir(prefix: str, vmid: int) -> Path:
    """``/run/orch-sandbox/<orch-id>/<vmid>``: where the hook mounts what the container uses."""
    return STAGING / prefix / str(vmid)


def hook_lines(
    hook: Path,
    stage: Path,
    rootfs: Path,
    usr: tuple[Path, Path],
    driver: Path,
    binds: Iterable[Path],
) -> tuple[list[str], dict[str, str]]:
    """(the config's hook lines, the staged path of each source) for one container (pure).

    >>> lines, staged = hook_lines(Path("/h"), Path("/run/s"), Path("/d/rootfs"),
    ...     (Path("/d/usr"), Path("/d/w")), Path("/d/driver"), [Path("/opt/venv")])
    >>> staged["/opt/venv"], staged["usr"]
    ('/run/s/py0', '/run/s/usr')
    >>> lines[0].split()[:5]
    ['lxc.hook.pre-start', '=', '/h', '/run/s', 'bind']
    """
    staged = {
        "rootfs": str(stage / "rootfs"),
        "usr": str(stage / "usr"),
        "driver": str(stage / "driver"),
    }
    args = [
        "bind",
        str(rootfs),
        staged["rootfs"],
        "overlay",
        "/usr",
        str(usr[0]),
        str(usr[1]),
        staged["usr"],
        "bind-ro",
        str(driver),
        staged["driver"],
    ]
    for i, path in enumerate(binds):
        staged[str(path)] = str(stage / f"py{i}")
        args += ["bind-ro", str(path), staged[str(path)]]
    call = " ".join([str(hook), str(stage), *args, "--"])  # LXC appends: NAME lxc TYPE
    return [f"lxc.hook.pre-start = {call}"], staged


def chown_tree(top: Path, uid: int = ROOT_ID, gid: int = ROOT_ID) -> None:
    """Shift the owner of everything below ``top`` (``top`` too) by the container's map: a
    host uid ``u`` < 65536 becomes ``uid + u`` (links themselves, never followed)."""
    for here, dirs, files in os.walk(top):
        for name in (here, *(os.path.join(here, n) for n in (*dirs, *files))):
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(name)
                if st.st_uid < ID_COUNT or st.st_gid < ID_COUNT:
                    os.lchown(name, uid + st.st_uid % ID_COUNT, gid + st.st_gid % ID_COUNT)


def unmount_staging(prefix: str) -> None:
    """Unmount and remove ``/run/orch-sandbox/<orch-id>`` (what a killed container left)."""
    top = STAGING / prefix
    if not top.exists():
        return
    for _ in range(8):  # stacked mounts too, deepest first
        mounts = sorted(
            (m for m in _mount_points() if m.startswith(f"{top}/")), key=len, reverse=True
        )
        if not mounts:
            break
        for m in mounts:
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30, check=False)
    for here, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
        with contextlib.suppress(OSError):
            os.rmdir(here)
    with contextlib.suppress(OSError):
        top.parent.rmdir()


def _mount_points() -> list[str]:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[4] for line in lines if len(line.split()) > 4]


def mapped_root(config_text: str) -> int:
    """The host uid of container root from an LXC config's ``lxc.idmap = u 0 HOST N``; 0 without.

    >>> mapped_root("lxc.idmap = u 0 100000 65536\\n"), mapped_root("lxc.uts.name = ct200\\n")
    (100000, 0)
    """
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        parts = value.split()
        if key.strip() == "lxc.idmap" and len(parts) == 4 and parts[:2] == ["u", "0"]:
            return int(parts[2]) if parts[2].isdigit() else 0
    return 0
