"""The host observer's cheap reads give what the plain ones gave: the cgroup walk's PID order
(``os.walk`` with sorted directories), ``read_text``'s limit, and the resident's warm-up."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.agent import cgroups
from orchestrator.agent.__main__ import build_parser
from orchestrator.agent.prewarm import prewarm
from orchestrator.agent.rootfs import ContainerRoot


def _walk_members(directory: str) -> list[int]:
    """The walk as it was (``os.walk``, directories sorted, each ``cgroup.procs``)."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        if "cgroup.procs" in files:
            out += [int(w) for w in Path(root, "cgroup.procs").read_text().split() if w.isdigit()]
    return out


def test_the_cgroup_walk_lists_pids_in_the_order_os_walk_did(tmp_path: Path) -> None:
    pid = iter(range(100, 1000))
    for rel in ("", "ns", "ns/b.slice", "ns/a.slice", "ns/a.slice/x", "ns/init.scope", "z"):
        d = tmp_path / "lxc" / "200" / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text(f"{next(pid)}\n{next(pid)}\n")
        (d / "memory.max").write_text("max\n")
    (tmp_path / "lxc/200/ns/empty").mkdir()  # a cgroup without cgroup.procs: nothing from it
    top = str(tmp_path / "lxc" / "200")
    got = list(cgroups.members(top))
    assert got == _walk_members(top) and len(got) == 14
    assert list(cgroups.members(top, limit=3)) == got[:3]
    assert list(cgroups.members(str(tmp_path / "gone"))) == []


def test_read_text_reads_up_to_its_limit_and_none_for_a_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "status"
    f.write_bytes(b"x" * 70000 + "é".encode())
    assert cgroups.read_text(str(f)) == "x" * 65536
    assert cgroups.read_text(str(f), 1 << 20) == "x" * 70000 + "é"
    assert cgroups.read_text(str(tmp_path / "none")) is None
    assert cgroups.read_text(str(tmp_path)) is None  # a directory: unreadable, not a crash


def test_a_container_file_reads_with_its_mtime_and_limit(tmp_path: Path) -> None:
    (tmp_path / "pgid").write_bytes(b"42\n" * 200)
    with ContainerRoot(str(tmp_path)) as root:
        data, mtime = root.read("pgid", 256)
        assert data == (b"42\n" * 200)[:256]
        assert mtime == os.stat(tmp_path / "pgid").st_mtime
        assert root.read("missing", 256) == (None, None)


def test_the_residents_warm_up_runs_every_piece(tmp_path: Path) -> None:
    bundle = Path(__file__).resolve().parents[2]  # the checkout stands for the bundle
    assert prewarm(str(bundle), build_parser(with_runs=False), rounds=2) == []
    assert prewarm(str(tmp_path), None, rounds=1) == []  # no bundle file: the read is None
