"""Every shared rule exists once: each test here checks the one place and that
no second copy came back (a copy that drifts is how two of them came to disagree)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.inventory import ContainerConfig
from orchestrator.detect import base
from orchestrator.errors import UsageError
from orchestrator.monitor.state import stopped_on_request, target_state
from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import stop_was_requested
from orchestrator.remote import deploy
from orchestrator.wire import formats, paths, secrets
from orchestrator.wire.model import RunState, Snapshot

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    p: p.read_text()
    for p in sorted((ROOT / "orchestrator").rglob("*.py"))
    if "sandbox" not in p.parts  # the sandbox stands in for Proxmox; its rewrite is pending
}


def _defining(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.M)
    return [str(p.relative_to(ROOT)) for p, text in SOURCES.items() if rx.search(text)]


def test_gpu_lists_are_parsed_in_one_place_with_the_cap() -> None:
    assert _defining(r"^def parse_gpu(s|_spec|_list)?\b") == ["orchestrator/wire/formats.py"]
    from orchestrator.lifecycle.launch import resolve_gpus

    ct = ContainerConfig(name="ct", host="h", gpus={"target": (0, 1)})
    assert resolve_gpus(ct, "6,0-1") == (0, 1, 6)
    with pytest.raises(UsageError, match="--gpus: GPU index 5000 is above 1023"):
        resolve_gpus(ct, "0-5000")  # was 5001 indices through agent/runs.parse_gpus


def test_the_agent_refuses_a_gpu_list_past_the_cap(tmp_path: Path) -> None:
    """The agent parses ``launch --gpus`` with the same function (it ships in the bundle)."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.agent",
            "launch",
            "--workdir",
            str(tmp_path),
            "--cmd",
            "true",
            "--run-id",
            "r1",
            "--gpus",
            "0-5000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 2, res.stderr
    doc = json.loads(res.stdout)
    assert doc["error"] == "bad-argument" and "above 1023" in doc["message"]
    assert not (tmp_path / "runs").exists(), "nothing may be created for a refused launch"


@pytest.mark.parametrize(("ended", "stopped"), [(9.0, True), (8.9, False), (None, True)])
def test_stopped_on_request_is_one_rule(ended: float | None, stopped: bool) -> None:
    """The state word, the exit-status detector and the verdict use one grace (1 s)."""
    assert _defining(r"^STOP_SLACK_S\b") == ["orchestrator/detect/base.py"]
    asked = 10.0
    assert base.ended_on_request(asked, ended) is stopped
    run = RunState("r", "/r", exit_status=130, exit_status_at=ended, stop_requested_at=asked)
    snap = Snapshot("ct", 20.0, run=run)
    assert stopped_on_request(run, 20.0) is stopped or ended is None
    assert (target_state(snap) == "stopped") is (stopped or ended is None)
    ev = Evidence("ct", 20.0, stop_requested_at=asked, exit_status_at=ended)
    assert stop_was_requested(ev) is stopped


def test_secret_masking_ships_to_the_agent() -> None:
    assert _defining(r"^SECRET_WORDS\b") == ["orchestrator/wire/secrets.py"]
    assert _defining(r"^def redact_tree\b|^def redact\(") == ["orchestrator/wire/secrets.py"]
    from orchestrator.agent import runs

    assert runs.mask_env is secrets.mask_env
    assert "orchestrator/wire/secrets.py" in deploy.build_bundle().files


def test_run_ids_have_one_utc_format() -> None:
    assert _defining(r"^def new_run_id\b") == ["orchestrator/wire/formats.py"]
    assert re.fullmatch(r"\d{8}-\d{6}-x", formats.new_run_id("x"))
    from orchestrator.agent import runs
    from orchestrator.lifecycle import launch

    assert runs.new_run_id is launch.new_run_id is formats.new_run_id
    assert "token_hex" not in SOURCES[ROOT / "orchestrator/agent/runs.py"]


def test_atomic_writes_have_one_implementation(tmp_path: Path) -> None:
    assert _defining(r"^def (atomic_write|_write_atomic)\b") == ["orchestrator/wire/paths.py"]
    from orchestrator.agent import runs

    assert runs.atomic_write is paths.atomic_write
    assert "orchestrator/wire/paths.py" in deploy.build_bundle().files
    target = paths.atomic_write(tmp_path / "f", "text\n")
    assert target.read_text() == "text\n" and target.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_pct_status_is_parsed_in_one_place() -> None:
    assert _defining(r"^def parse_(pct_)?status\b") == ["orchestrator/wire/formats.py"]
    from orchestrator.agent import probe
    from orchestrator.postmortem import collect
    from orchestrator.transport import pct

    assert pct.parse_pct_status is probe.parse_pct_status is collect.parse_pct_status
    assert formats.parse_pct_status("status: running\n") == "running"


def test_the_bundle_marker_is_one_constant() -> None:
    literal = [str(p.relative_to(ROOT)) for p, text in SOURCES.items() if ".orch-bundle" in text]
    assert literal == ["orchestrator/remote/deploy.py"]
    assert SOURCES[ROOT / "orchestrator/remote/deploy.py"].count(".orch-bundle") == 1
    from orchestrator.remote import target

    assert deploy.MARKER in target._BOOT and "__MARKER__" not in target._BOOT
    assert deploy.MARKER in deploy._CHECK and deploy.MARKER in deploy._UNPACK


def test_dead_names_are_gone() -> None:
    assert not _defining(r"^_OOM_INVOKED\b|^STATES = ")
    assert not _defining(r"getattr\([^)]*\"stderr_tail\"")


def _holding(literal: str) -> list[str]:
    """Source files holding ``literal`` itself: a copy under another name fails too."""
    return [str(p.relative_to(ROOT)) for p, text in SOURCES.items() if literal in text]


@pytest.mark.parametrize(
    ("literal", "owner"),
    [
        ("command exited with status %s", None),  # the wrapper writes it from EXIT_LINE
        ('"[orch] command exited with status', "orchestrator/wire/requests.py"),
        ('"%Y%m%d-%H%M%S"', "orchestrator/wire/formats.py"),
        ('"%Y%m%dT%H%M%SZ"', "orchestrator/wire/formats.py"),
        ('default="train"', None),
        ('session: str = "train"', None),
    ],
)
def test_each_literal_lives_in_its_one_owner(literal: str, owner: str | None) -> None:
    assert _holding(literal) == ([owner] if owner else [])


def test_the_wrapper_writes_the_exit_line_the_detector_reads() -> None:
    from orchestrator.agent import wrapper
    from orchestrator.detect import run
    from orchestrator.wire.requests import EXIT_LINE

    assert run.WRAPPER_EXIT is EXIT_LINE
    assert f"printf '\\n{EXIT_LINE} %s at %s\\n'" in wrapper.WRAPPER


def test_the_launchers_poll_at_one_interval() -> None:
    from orchestrator.lifecycle import job_launch, launch

    polls = _defining(r"^[A-Z_]*POLL[A-Z_]*\s*=\s*[\d.]+")
    assert [p for p in polls if "lifecycle/" in p and "launch" in p] == [
        "orchestrator/lifecycle/launch.py"
    ]
    assert job_launch.VERIFY_POLL_S is launch.VERIFY_POLL_S


def test_bundle_and_archive_stamps_are_one_function() -> None:
    from orchestrator.lifecycle.procedures import archive_name
    from orchestrator.postmortem.collect import default_bundle_dir
    from orchestrator.postmortem.evidence import Evidence

    assert _defining(r"^def utc_stamp\b") == ["orchestrator/wire/formats.py"]
    assert default_bundle_dir(Evidence("ct", 0.0, run_id="r"), now=0).name == "ct-r-19700101-000000"
    assert archive_name("/w/x", now=0) == "/w/x.orch-19700101T000000Z"
    assert "strftime" not in SOURCES[ROOT / "orchestrator/postmortem/jobs.py"]


def test_code_carries_no_issue_numbers() -> None:
    """The history lives in git: a comment or docstring says what is, not which issue asked."""
    rx = re.compile(r"\b[Ii]ssues? #?\d+")
    assert [str(p.relative_to(ROOT)) for p, text in SOURCES.items() if rx.search(text)] == []
