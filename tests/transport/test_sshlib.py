"""paramiko loaded through ``transport/sshlib.py``: the same paramiko, without
``importlib.metadata`` (its ``__version__``, which paramiko sends in its SSH banner, read
from the same METADATA file)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from orchestrator.transport import sshlib


def test_the_version_is_the_one_importlib_metadata_gives() -> None:
    assert sshlib._paramiko_version("paramiko") == metadata.version("paramiko")


def test_a_fresh_process_loads_paramiko_without_importlib_metadata() -> None:
    code = (
        "import sys\n"
        "from orchestrator.transport.sshlib import paramiko\n"
        "print(paramiko.__version__, 'importlib.metadata' in sys.modules)\n"
        "from importlib import metadata\n"  # the real one afterwards, not the stand-in
        "print(metadata.version('paramiko'), hasattr(metadata, 'distribution'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    want = metadata.version("paramiko")
    assert out == [want, "False", want, "True"]
