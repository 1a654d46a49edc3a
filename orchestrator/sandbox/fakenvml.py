"""Build the sandbox's C parts with the system C compiler, cached by source hash: the fake
``libnvidia-ml.so.1`` (fakenvml.c) and an LXC container's ``/sbin/init`` (init.c).

Equivalent by hand::

    cc -shared -fPIC -O2 -o DIR/libnvidia-ml.so.1 orchestrator/sandbox/fakenvml.c
    cc -O2 -o DIR/init orchestrator/sandbox/init.c

A process finds it through ``LD_LIBRARY_PATH=DIR`` (real pynvml does
``CDLL("libnvidia-ml.so.1")``) and reads its scenario from
``$ORCH_FAKE_NVML_SCENARIO`` (else ``/dev/orch-nvidia/scenario.json``) on every call.
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
INIT_SOURCE = Path(__file__).with_name("init.c")
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


def source_hash(source: Path = SOURCE) -> str:
    """SHA-256 (hex, first 16 chars) of a C source: the cache key of what was built from it."""
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def find_compiler() -> str:
    """``$CC``, else ``cc``, else ``gcc``; raises :class:`MissingTool` when none is on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    raise MissingTool("a C compiler (cc)", "gcc")


def build_fake_nvml(dest_dir: Path, *, timeout_s: float = 60.0) -> Path:
    """Compile fakenvml.c to ``dest_dir/libnvidia-ml.so.1`` unless the same source is built there.

    Returns:
        The library path (its directory is what goes on ``LD_LIBRARY_PATH``).

    Raises:
        MissingTool: no C compiler.
        OrchError: the compiler failed (its stderr in the message) or ran past ``timeout_s``.
    """
    return compile_c(SOURCE, Path(dest_dir) / LIBRARY_NAME, ["-shared", "-fPIC"], timeout_s)


def build_init(dest_dir: Path, *, timeout_s: float = 60.0) -> Path:
    """Compile init.c (PID 1 of a sandbox LXC container) to ``dest_dir/init``; as :func:`build_fake_nvml`."""
    return compile_c(INIT_SOURCE, Path(dest_dir) / "init", [], timeout_s)


def compile_c(source: Path, output: Path, flags: list[str], timeout_s: float = 60.0) -> Path:
    """``cc FLAGS -O2 -o OUTPUT SOURCE`` unless ``OUTPUT`` was built from the same source.

    The stamp file ``.<name>.sha`` beside the output holds the hash of the source it
    came from; the output is written to a temp name and renamed, so a process loading
    it never sees half a file.

    Raises:
        MissingTool: no C compiler.
        OrchError: the compiler failed (its stderr in the message) or ran past ``timeout_s``.
    """
    output = output.absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    stamp = output.with_name(f".{output.name}.sha")
    want = source_hash(source)
    if output.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return output
    compiler = find_compiler()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run(
            [compiler, *flags, "-O2", "-o", str(tmp), str(source)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise OrchError(f"building {source.name} failed ({compiler}): {proc.stderr.strip()}")
        tmp.chmod(0o755)
        os.replace(tmp, output)
    except subprocess.TimeoutExpired as exc:
        raise OrchError(f"building {source.name} took over {timeout_s} s") from exc
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(want + "\n")
    return output
