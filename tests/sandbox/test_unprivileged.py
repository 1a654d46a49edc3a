"""Unprivileged sandbox containers (orchestrator/sandbox/unpriv.py), on real LXC.

As Proxmox makes a container by default (pve-container src/PVE/LXC.pm parse_id_maps:
``['u', '0', '100000', '65536'], ['g', '0', '100000', '65536']``): root inside is uid 100000
outside, its files are owned by 100000 and up, ``pct push`` creates them as the container's
root (pct.pm push: setns into its user namespace, setuid(0)), the operator's Python stays
usable, and ``orch sandbox down`` leaves no mount behind.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SANDBOX_ISOLATION

pytestmark = [pytest.mark.e2e, pytest.mark.unprivileged]


@pytest.fixture(scope="module")
def top() -> Iterator[Path]:
    """A directory uid 100000 may traverse: not pytest's (every pytest session on the
    machine resets /tmp/pytest-of-<user> to 0700, and LXC then refuses the container)."""
    path = Path(tempfile.mkdtemp(prefix="orch-unpriv-test-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def ct(top: Path) -> Iterator[object]:
    from orchestrator.sandbox import manager

    if SANDBOX_ISOLATION == "process":
        pytest.skip("unprivileged containers are LXC's")
    state_dir = top / "unpriv"
    try:
        info = manager.up(
            state_dir,
            containers=1,
            gpus=2,
            scenario="idle",
            isolation=SANDBOX_ISOLATION,
            unprivileged=True,
        )
    except manager.SandboxError as exc:
        if SANDBOX_ISOLATION == "auto":
            pytest.skip(f"LXC containers cannot run here: {exc}")
        raise
    try:
        yield info
    finally:
        manager.down(state_dir)


def _pct(ct, *args: str):  # type: ignore[no-untyped-def]
    from orchestrator.sandbox.manager import run_pct

    return run_pct(ct.state_dir, *args)


def test_root_inside_is_100000_outside(ct) -> None:  # type: ignore[no-untyped-def]
    out = _pct(
        ct, "exec", "200", "--", "sh", "-c", "cat /proc/self/uid_map; id -u; stat -c %u /root"
    )
    uid_map, uid, owner = out.stdout.split("\n")[:3]
    assert uid_map.split() == ["0", "100000", "65536"] and (uid, owner) == ("0", "0"), out.stderr
    root = ct.host_path(200, "/root")
    assert (root.stat().st_uid, root.stat().st_gid) == (100000, 100000)
    init = ct.init_pid("ct200")
    assert Path(f"/proc/{init}/status").read_text().split("Uid:")[1].split()[0] == "100000"
    conf = (ct.state_dir / "etc" / "pve" / "lxc" / "200.conf").read_text()
    assert "unprivileged: 1\n" in conf


def test_pct_push_creates_files_as_the_containers_root(ct, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "f"
    src.write_text("pushed\n")
    assert _pct(ct, "push", "200", str(src), "/root/pushed").stderr == ""
    assert (
        _pct(
            ct,
            "push",
            "200",
            str(src),
            "/root/pushed-1000",
            "--user",
            "1000",
            "--group",
            "1000",
            "--perms",
            "600",
        ).stderr
        == ""
    )
    plain, mine = ct.host_path(200, "/root/pushed"), ct.host_path(200, "/root/pushed-1000")
    assert (plain.stat().st_uid, mine.stat().st_uid, mine.stat().st_gid) == (100000, 101000, 101000)
    inside = _pct(ct, "exec", "200", "--", "stat", "-c", "%u %a", "/root/pushed-1000").stdout
    assert inside.split() == ["1000", "600"]
    back = tmp_path / "back"
    _pct(ct, "pull", "200", "/root/pushed", str(back))
    assert back.read_text() == "pushed\n"


def test_the_operators_python_and_usr_local_work(ct) -> None:  # type: ignore[no-untyped-def]
    code = "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())"
    out = _pct(ct, "exec", "200", "--", sys.executable, "-c", code)
    assert (out.returncode, out.stdout.strip()) == (0, "2"), out.stderr
    out = _pct(
        ct,
        "exec",
        "200",
        "--",
        "sh",
        "-c",
        "echo x > /usr/local/bin/orch-unpriv && cat /usr/local/bin/orch-unpriv",
    )
    assert out.stdout == "x\n", out.stderr
    assert ct.host_path(200, "/usr/local/bin/orch-unpriv").stat().st_uid == 100000
    assert not Path("/usr/local/bin/orch-unpriv").exists()


def test_down_leaves_no_mount(top: Path, ct) -> None:  # type: ignore[no-untyped-def]
    """A second sandbox, up and down: nothing of it stays mounted under /run/orch-sandbox."""
    from orchestrator.sandbox import lxc, manager

    state_dir = top / "unpriv-down"
    manager.up(state_dir, containers=1, gpus=1, scenario="idle", isolation="lxc", unprivileged=True)
    prefix = lxc.cgroup_prefix(state_dir)
    assert f"/run/orch-sandbox/{prefix}/200/rootfs " in Path("/proc/self/mountinfo").read_text()
    manager.stop_container(state_dir, "ct200")
    manager.start_container(state_dir, "ct200")  # the next start replaces the staged mounts
    assert (
        Path("/proc/self/mountinfo").read_text().count(f"/run/orch-sandbox/{prefix}/200/rootfs ")
        == 1
    )
    manager.down(state_dir)
    assert f"/run/orch-sandbox/{prefix}/" not in Path("/proc/self/mountinfo").read_text()


def test_a_directory_the_mapped_root_cannot_enter_is_refused(top: Path, ct) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.sandbox import manager

    shut = top / "shut"
    shut.mkdir(mode=0o700)
    with pytest.raises(
        manager.SandboxError, match=r"uid 100000 may not enter \S*/shut \(.*chmod o\+x"
    ):
        manager.up(shut / "sb", containers=1, gpus=1, isolation="lxc", unprivileged=True)
