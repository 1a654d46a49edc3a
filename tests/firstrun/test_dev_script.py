"""README's "First five minutes" as a newcomer reads it: two command lines, each set up by
``./dev`` itself, the test one the same that .ci/run runs; references that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _first_five_minutes() -> str:
    return README.split("## First five minutes", 1)[1].split("\n## ", 1)[0]


def test_first_five_minutes_holds_exactly_two_commands() -> None:
    commands = re.findall(r"^    \$ (.+)$", _first_five_minutes(), re.M)
    assert commands == ["./dev demo", "./dev test"]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run's own extraction (its sed line) finds ``./dev test`` and nothing else first."""
    ci = (ROOT / ".ci" / "run").read_text()
    [line] = [x for x in ci.splitlines() if x.startswith("test_cmd=$(sed")]
    sed = re.search(r"sed -n '([^']+)'", line)
    assert sed is not None, line
    out = subprocess.run(
        ["sed", "-n", sed.group(1), str(ROOT / "README.md")],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    assert out.stdout.splitlines()[0] == "./dev test"
    assert "./dev setup" in ci


def test_dev_without_a_subcommand_says_how_to_use_it() -> None:
    proc = subprocess.run(
        [str(ROOT / "dev")], capture_output=True, text=True, timeout=10, check=False
    )
    assert proc.returncode == 2 and "./dev demo" in proc.stderr and "./dev test" in proc.stderr


def test_not_root_and_a_package_missing_prints_the_sudo_line_and_exits_2() -> None:
    """PATH without tmux (and the rest): nothing is installed, the exact line to run is printed."""
    # as root, ./dev would install: run it as nobody (setpriv, util-linux)
    as_user = (
        [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        if os.geteuid() == 0
        else []
    )
    with tempfile.TemporaryDirectory(prefix="orch-dev-") as tmp:  # nobody must reach it
        Path(tmp).chmod(0o755)
        _sudo_line(Path(tmp) / "bin", as_user)


def _sudo_line(bin_dir: Path, as_user: list[str]) -> None:
    bin_dir.mkdir()
    for tool in ("bash", "cat", "sort", "tr", "id", "dirname", "python3", "mkdir"):
        real = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if real:
            (bin_dir / tool).symlink_to(real)
    proc = subprocess.run(
        [*as_user, str(ROOT / "dev"), "setup"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": str(bin_dir)},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.startswith(
        "sudo apt-get update && sudo apt-get install -y --no-install-recommends "
    )
    assert " tmux" in proc.stdout


def test_pyproject_comments_name_files_that_exist() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    named = re.findall(
        r"\b([\w./-]+\.md)\b",
        " ".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line),
    )
    assert named and [n for n in named if not (ROOT / n).exists()] == []
