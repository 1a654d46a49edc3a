"""Config validation: one clear line naming file:line: key, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.procs import ROOT, TINY, trainer_env
from trainer.cli import main
from trainer.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train:\n  steps: 5\n  lrate: 0.1\n", ":3: train.lrate: unknown key"),
        ("train:\n  lr: fast\n", ":2: train.lr: must be a number, got 'fast'"),
        ("drafter:\n  target_layers: [0, 9]\n", ":2: drafter.target_layers: [9] outside 0..3"),
        (
            "devices:\n  drafter: [gpu0]\n",
            ":2: devices.drafter: device 'gpu0' must be 'cpu' or 'cuda:N'",
        ),
        (
            "train:\n  batch_size: 3\ndevices:\n  drafter: [cpu, cpu]\n",
            ":2: train.batch_size: 3 is not divisible by 2",
        ),
        ("trian:\n  lr: 1\n", ":1: trian: unknown section"),
        ("data:\n  kind: text\n  path: /nonexistent/x.txt\n", ":3: data.path: no such file"),
        ("train:\n  steps: [1\n", "yaml"),
        (
            "train:\n  grad_checkpoint: 1\n",
            ":2: train.grad_checkpoint: must be true or false, got 1",
        ),
    ],
)
def test_bad_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    rc = main(["--config", str(path), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {path}")
    assert expected in err
    assert not (tmp_path / "run").exists()


def test_bad_config_subprocess_has_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "drafter:\n  n_layers: -1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(path)],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"error: {path}:2: drafter.n_layers: must be > 0, got -1\n"
    assert proc.stdout == ""


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: file: cannot read" in capsys.readouterr().err


def test_device_map_without_accelerate_fails_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    try:
        import accelerate  # noqa: F401

        pytest.skip("accelerate is installed here; the fail-fast path cannot trigger")
    except ImportError:
        pass
    path = write(tmp_path, f"target:\n  hf_path: {tmp_path}\n  device_map: auto\n")
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "target.device_map='auto' needs the 'accelerate' package" in err


def test_hf_target_without_transformers_fails_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        import transformers  # noqa: F401

        pytest.skip("transformers is installed here")
    except ImportError:
        pass
    path = write(tmp_path, f"target:\n  hf_path: {tmp_path}\n")
    assert main(["--config", str(path)]) == 2
    assert "target.hf_path needs the 'transformers' package" in capsys.readouterr().err


def test_overrides_and_shipped_configs() -> None:
    cfg = load_config(TINY, ["devices.drafter=[cpu]", "train.lr=0.01"])
    assert cfg.devices.drafter == ["cpu"] and cfg.train.lr == 0.01
    big = load_config(ROOT / "trainer" / "configs" / "dflash-8gpu.yaml")
    assert big.devices.target == [f"cuda:{i}" for i in range(5)]
    assert big.devices.drafter == ["cuda:5", "cuda:6", "cuda:7"]
    with pytest.raises(ConfigError, match="train.nope: unknown key"):
        load_config(TINY, ["train.nope=1"])


def test_bad_fault_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(TINY), "--fault", "explode@3"])
    assert exc.value.code == 2
    assert "unknown fault 'explode'" in capsys.readouterr().err
