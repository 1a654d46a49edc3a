"""The vocabularies (playbooks/vocab/*.tsv) against the sources they were read from."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import string
from pathlib import Path

import pynvml
import pytest

from orchestrator.errors import ConfigError
from orchestrator.playbooks.loader import DEFAULT_DIR, load_playbooks, match_log
from orchestrator.playbooks.vocab import VOCAB_DIR, load_tables, parse_table

TABLES = {Path(t.path).stem: t for t in load_tables(DEFAULT_DIR / VOCAB_DIR)}
CUDART = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")


@pytest.fixture(scope="module")
def pbs():
    return load_playbooks()


def test_every_table_names_its_source_and_known_playbooks(pbs) -> None:
    ids = {p.id for p in pbs}
    assert len(TABLES) >= 9
    for t in TABLES.values():
        assert t.source and t.entries, t.path
        assert {e.playbook for e in t.entries} <= ids, t.path


@pytest.mark.skipif(not CUDART.exists(), reason="the CUDA 13.0 runtime is not installed here")
def test_cuda_runtime_texts_are_cudagetErrorString() -> None:
    lib = ctypes.CDLL(str(CUDART))
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    for e in TABLES["cuda-runtime"].entries:
        assert lib.cudaGetErrorName(e.code).decode() == e.name
        assert lib.cudaGetErrorString(e.code).decode() == e.text


def test_nvml_names_and_texts_are_pynvml() -> None:
    for e in TABLES["nvml"].entries:
        const = next(
            a for a in dir(pynvml) if a.startswith("NVML_ERROR_") and getattr(pynvml, a) == e.code
        )
        cls = "NVMLError_" + string.capwords(const.replace("NVML_ERROR_", ""), "_").replace("_", "")
        assert (cls, pynvml.NVMLError._errcode_to_string[e.code]) == (e.name, e.text)
        assert hasattr(pynvml, e.name)


def test_errno_and_signals_are_the_platform_s() -> None:
    for e in TABLES["errno"].entries:
        assert (getattr(errno, e.name), os.strerror(e.code)) == (e.code, e.text)
    for e in TABLES["signals"].entries:
        assert (int(getattr(signal, e.name)), signal.strsignal(e.code)) == (e.code, e.text)


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu-ecc"),
        (
            "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=265 error=59 : device-side assert triggered",
            "device-side-assert",
        ),
        ("pynvml.NVMLError_GpuIsLost: GPU is lost", "gpu-fallen-off-bus"),
        (
            "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGSEGV: 11>.",
            "segfault",
        ),
        (
            "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGBUS",
            "shm-too-small",
        ),
        ("Bus error (core dumped)", "shm-too-small"),
        (
            "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.14.3",
            "nccl-error",
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.5GiB.",
            "cuda-oom",
        ),
        (
            "[ 1234.5] Out of memory: Kill process 4242 (python) score 901 or sacrifice child",
            "oom-killer",
        ),
        (
            "ImportError: /venv/lib/python3.10/site-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
            "extension-abi-mismatch",
        ),
        (
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
            "driver-too-old",
        ),
        ("OSError: [Errno 104] Connection reset by peer", "peer-connection-lost"),
    ],
)
def test_a_line_in_each_vocabulary_s_words(pbs, line: str, want: str) -> None:
    assert [m.id for m in match_log([line], pbs)][:1] == [want]


def test_bad_table_is_one_config_error_with_file_line(tmp_path: Path) -> None:
    text = "# source: x\n# form: {text}\n1\tA\tsegfault\tsure\tno\tboom\n"
    with pytest.raises(ConfigError) as exc:
        parse_table(text, "t.tsv")
    assert (exc.value.line, exc.value.key) == (3, "confidence")
    with pytest.raises(ConfigError, match="no playbook 'nope'"):
        (tmp_path / "vocab").mkdir()
        (tmp_path / "vocab" / "t.tsv").write_text(
            "# source: x\n# form: {text}\n1\tA\tnope\tcertain\tno\tboom\n"
        )
        load_playbooks(tmp_path)
