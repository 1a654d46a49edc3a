"""Build the fake ``libnvidia-ml.so.1`` (fakenvml.c) with the system C compiler, cached by source hash.

Equivalent by hand::

    cc -shared -fPIC -O2 -o DIR/libnvidia-ml.so.1 orchestrator/sandbox/fakenvml.c

A process finds it through ``LD_LIBRARY_PATH=DIR`` (real pynvml does
``CDLL("libnvidia-ml.so.1")``) and reads its scenario from
``$ORCH_FAKE_NVML_SCENARIO`` on every call.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from orchestrator.errors import OrchError

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
SCENARIO_ENV = "ORCH_FAKE_NVML_SCENARIO"


class MissingTool(OrchError):
    """A program the sandbox needs is not installed (exit 2); the message names the apt package.

    >>> str(MissingTool("cc", "gcc"))
    'sandbox needs cc, which is not installed; install it with: apt-get install -y gcc'
    """

    exit_code = 2

    def __init__(self, tool: str, package: str) -> None:
        self.tool, self.package = tool, package
        super().__init__(
            f"sandbox needs {tool}, which is not installed; install it with: "
            f"apt-get install -y {package}"
        )


def source_hash() -> str:
    """SHA-256 (hex, first 16 chars) of fakenvml.c: the cache key of a built library."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def find_compiler() -> str:
    """``$CC``, else ``cc``, else ``gcc``; raises :class:`MissingTool` when none is on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    raise MissingTool("a C compiler (cc)", "gcc")


def build_fake_nvml(dest_dir: Path, *, timeout_s: float = 60.0) -> Path:
    """Compile fakenvml.c to ``dest_dir/libnvidia-ml.so.1`` unless the same source is built there.

    The stamp file ``dest_dir/.fakenvml.sha`` holds the hash of the source the
    library came from; the library is written to a temp name and renamed, so a
    process loading it never sees half a file.

    Returns:
        The library path (its directory is what goes on ``LD_LIBRARY_PATH``).

    Raises:
        MissingTool: no C compiler.
        OrchError: the compiler failed (its stderr in the message) or ran past ``timeout_s``.
    """
    dest_dir = Path(dest_dir).absolute()
    dest_dir.mkdir(parents=True, exist_ok=True)
    lib, stamp = dest_dir / LIBRARY_NAME, dest_dir / ".fakenvml.sha"
    want = source_hash()
    if lib.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return lib
    compiler = find_compiler()
    fd, tmp_name = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".tmp", dir=dest_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise OrchError(
                f"building the fake libnvidia-ml failed ({compiler}): {proc.stderr.strip()}"
            )
        tmp.chmod(0o755)
        os.replace(tmp, lib)
    except subprocess.TimeoutExpired as exc:
        raise OrchError(f"building the fake libnvidia-ml took over {timeout_s} s") from exc
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(want + "\n")
    return lib
