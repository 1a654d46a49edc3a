"""The bundle's unpacker on a full disk: a clear error, and no ``agent-<hash>.tmp-PID``
directory left behind on any attempt (a real 64 KiB tmpfs)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.remote import deploy


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_one_clear_error_and_leaves_no_temp_directory(full_disk: Path) -> None:
    bundle = deploy.build_bundle()
    dest = full_disk / ".orch" / f"agent-{bundle.hash}"
    for _ in range(2):  # every attempt cleans up after itself
        res = subprocess.run(
            [sys.executable, "-c", deploy._UNPACK, str(dest), bundle.hash],
            input=bundle.tarball,
            capture_output=True,
            timeout=60,
        )
        err = res.stderr.decode()
        assert res.returncode == 5, err
        assert "cannot unpack the bundle into" in err and "No space left on device" in err, err
        assert "Traceback" not in err
        assert not list((full_disk / ".orch").glob("*.tmp-*"))
    assert not dest.exists()
