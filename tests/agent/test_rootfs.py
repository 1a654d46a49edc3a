"""Reading a container's files from the host leaks no host byte (orchestrator/agent/rootfs.py).

A container's root user controls every path under its root: symlinks (absolute, relative
``..``, a symlinked directory, ``/proc/self/root`` magic), FIFOs and device nodes. Each is
planted under a directory standing for the container's root, next to a canary file on the
"host" side, and read both ways the reader resolves (openat2 ``RESOLVE_IN_ROOT`` and the
in-root walker). Nothing may return the canary; a FIFO must not block. The same planting
through a real LXC container is in test_host_observer.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from orchestrator.agent.containerview import RootFiles
from orchestrator.agent.logs import LogReader
from orchestrator.agent.rootfs import ContainerRoot
from orchestrator.agent.runfacts import RunReader

CANARY = b"HOST-CANARY-3f9c1e do not leak"

MODES = [pytest.param(None, id="openat2"), pytest.param(False, id="walker")]


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """(root, canary): a container root full of traps, and a host file outside it."""
    canary = tmp_path / "host-secret"
    canary.write_bytes(CANARY)
    root = tmp_path / "ct" / "rootfs"
    runs = root / "root" / "dflash" / "runs"
    (runs / "r1").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    depth = len(runs.relative_to(tmp_path).parts) + 3
    traps = {
        "abs": str(canary),  # absolute: the host's file through /proc/<pid>/root
        "rel": "../" * depth + "host-secret",  # relative, climbing past the root
        "dir": str(tmp_path),  # a symlinked directory: dir/host-secret
        "magic": "/proc/self/root" + str(canary),  # a magic link
        "chain": "abs",  # a symlink to a symlink
        "loop": "loop",
        "inside": "/etc/passwd",  # absolute, resolved inside: fine to read
    }
    for name, target in traps.items():
        (runs / name).symlink_to(target)
    os.mkfifo(runs / "fifo")
    (runs / "current").symlink_to(str(canary))  # runs/current -> the canary itself
    (runs / "r1" / "train.log").symlink_to(str(canary))
    (runs / "r1" / "manifest.json").symlink_to("../" * 8 + str(canary).lstrip("/"))
    return root, canary


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "path",
    [
        "root/dflash/runs/abs",
        "root/dflash/runs/rel",
        "root/dflash/runs/dir/host-secret",
        "root/dflash/runs/magic",
        "root/dflash/runs/chain",
        "root/dflash/runs/loop",
        "root/dflash/runs/fifo",
        "/../../../../host-secret",
    ],
)
def test_a_planted_path_never_reads_the_host_file(planted, mode, path) -> None:
    root, _canary = planted
    with ContainerRoot(str(root), use_openat2=mode) as r:
        data, _ = r.read(path)
    assert data is None or CANARY not in data


@pytest.mark.parametrize("mode", MODES)
def test_an_absolute_symlink_resolves_inside_the_root(planted, mode) -> None:
    root, _ = planted
    with ContainerRoot(str(root), use_openat2=mode) as r:
        assert r.read("root/dflash/runs/inside")[0] == b"root:x:0:0::/root:/bin/sh\n"
        # the symlinked directory points at the host's tmp dir: inside, that path is missing
        with pytest.raises(OSError):
            r.listdir("root/dflash/runs/dir")


@pytest.mark.parametrize("mode", MODES)
def test_a_fifo_is_refused_without_blocking(planted, mode) -> None:
    root, _ = planted
    done = threading.Event()

    def read() -> None:
        with ContainerRoot(str(root), use_openat2=mode) as r, pytest.raises(OSError):
            r.open("root/dflash/runs/fifo")
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert done.wait(5), "opening a planted FIFO blocked the reader"


@pytest.mark.parametrize("mode", MODES)
def test_the_run_reader_sees_no_host_byte(planted, mode) -> None:
    """runs/current, the manifest and the log all point at the canary: the run reads as missing."""
    root, _ = planted
    files = RootFiles()
    files.root = ContainerRoot(str(root), use_openat2=mode)
    try:
        reader = RunReader("/root/dflash", files)
        errors: list[str] = []
        run, nbytes = reader.read(1.0, errors)
        assert run is None and nbytes == 0
        (root / "root/dflash/runs/current").unlink()
        (root / "root/dflash/runs/current").write_text("r1\n")
        run, _ = reader.read(1.0, errors)
        assert run is not None and run.manifest is None and not run.log_exists
        assert CANARY.decode() not in repr(run) + repr(errors)
        chunk = LogReader(opener=files.open).read("/root/dflash/runs/r1/train.log", None)
        assert not chunk.exists and not chunk.lines
    finally:
        files.root.close()


def test_openat2_is_used_where_the_kernel_has_it(planted) -> None:
    root, _ = planted
    with ContainerRoot(str(root)) as r:
        r.read("etc/passwd")
        assert r._openat2 is True  # Linux >= 5.6: RESOLVE_IN_ROOT in the kernel


def test_the_walker_clamps_dotdot_at_the_root(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    (root / "top").write_text("inside")
    (tmp_path / "top").write_text("outside")
    with ContainerRoot(str(root), use_openat2=False) as r:
        assert r.read("a/../../../top")[0] == b"inside"
